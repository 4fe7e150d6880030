// inline_transport.h: TRANSPORT_INLINE. Each batch is assembled into a buffer of its own;
// its messages (the descriptor with the first part, then `more` parts of at most
// inline_part_bytes) reference that buffer and are sent from it without a copy. The
// buffer, and its share of the daemon's budget for batches in flight, is freed when its
// last part is written (or the stream drops it): acknowledgements free nothing. Its pages
// then go back to the stream's pool for a later batch (as many as the stream's credits).
#pragma once

#include <memory>
#include <vector>

#include "server/transports/transport.h"

namespace conveyor {

class InlineTransport final : public Transport {
 public:
  explicit InlineTransport(const TransportEnv& env);
  ~InlineTransport() override;
  const char* name() const override { return "inline"; }
  void Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                std::vector<OutgoingMessage>* out) override;
  void Release(uint64_t) override {}
  // Idle batch buffers kept for reuse (tests).
  size_t idle_buffers() const;
  class Pool;

 private:
  // Errors: ResourceExhausted (the daemon's budget, or no memory for the buffer).
  absl::StatusOr<std::unique_ptr<Destination>> ReserveChecked(uint64_t serial,
                                                              uint64_t bytes) override;
  std::shared_ptr<Pool> pool_;
};

}  // namespace conveyor
