// inline_transport.h: TRANSPORT_INLINE. Each batch is assembled into a buffer of its own;
// its messages (the descriptor with the first part, then `more` parts of at most
// inline_part_bytes) reference that buffer and are sent from it without a copy. The
// buffer, and its share of the daemon's budget for batches in flight, is freed when its
// last part is written (or the stream drops it): acknowledgements free nothing.
#pragma once

#include <memory>
#include <vector>

#include "server/transports/transport.h"

namespace conveyor {

class InlineTransport final : public Transport {
 public:
  explicit InlineTransport(const TransportEnv& env) : Transport(env) {}
  const char* name() const override { return "inline"; }
  void Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                std::vector<OutgoingMessage>* out) override;
  void Release(uint64_t) override {}

 private:
  // Errors: ResourceExhausted (the daemon's budget, or no memory for the buffer).
  absl::StatusOr<std::unique_ptr<Destination>> ReserveChecked(uint64_t serial,
                                                              uint64_t bytes) override;
};

}  // namespace conveyor
