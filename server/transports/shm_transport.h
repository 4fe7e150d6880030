// shm_transport.h: TRANSPORT_SHARED_MEMORY. Batches are assembled in slots of memfd
// segments (shared_memory.h: sealed, read-only for clients) that the daemon's FdServer hands
// out for the token announced in a SharedMemorySegment message; a batch's descriptor names
// its segment and offset. Idle older segments are released (forgotten by the FdServer and
// unmapped) as soon as their slots are all free.
#pragma once

#include <memory>

#include "server/transports/pooled_transport.h"

namespace conveyor {

class FdServer;

class ShmTransport final : public PooledTransport {
 public:
  // Errors: InvalidArgument when the daemon has no unix socket (options.fd_server).
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const v1::Subscribe& subscribe,
                                                           const TransportEnv& env);
  const char* name() const override { return "shm"; }

 private:
  explicit ShmTransport(const TransportEnv& env)
      : PooledTransport(env), fd_server_(env.options->fd_server) {}
  absl::StatusOr<std::unique_ptr<gpu::SlotPool>> MakeSegment(
      uint32_t id, uint64_t slot_bytes, uint32_t slots, v1::StreamResponse* announcement) override;
  void Locate(uint32_t segment, uint64_t offset, v1::BatchDescriptor* descriptor) const override;
  bool releases_idle_segments() const override { return true; }

  FdServer* const fd_server_;  // not owned; outlives the service
};

}  // namespace conveyor
