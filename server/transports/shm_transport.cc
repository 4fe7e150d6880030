#include "server/transports/shm_transport.h"

#include <string>

#include "cuda/slot_pool.h"
#include "server/shared_memory.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Transport>> ShmTransport::Create(const v1::Subscribe&,
                                                                const TransportEnv& env) {
  if (env.options->fd_server == nullptr) {
    return absl::InvalidArgumentError(
        "shared memory needs the daemon's unix socket (started without one)");
  }
  return std::unique_ptr<Transport>(new ShmTransport(env));
}

absl::StatusOr<std::unique_ptr<gpu::SlotPool>> ShmTransport::MakeSegment(
    uint32_t id, uint64_t slot_bytes, uint32_t slots, v1::StreamResponse* announcement) {
  auto shm = ShmSegment::Create(slot_bytes * slots);
  if (!shm.ok()) return shm.status();
  auto token = fd_server_->Register(*shm);
  if (!token.ok()) return token.status();
  v1::SharedMemorySegment* a = announcement->mutable_segment();
  a->set_id(id);
  a->set_bytes((*shm)->size());
  a->set_token(*token);
  a->set_fd_socket(fd_server_->path());
  // Page-locked for the CUDA assembler's copies back, if it is the one (null otherwise).
  std::shared_ptr<gpu::HostRegistration> locked = LockForAssembler((*shm)->data(), (*shm)->size());
  // The slots' memory lives as long as the pool: then it is unlocked, the token forgotten
  // (no client can fetch the descriptor any more) and the daemon's mapping goes.
  FdServer* fd_server = fd_server_;
  std::shared_ptr<std::byte> memory(
      (*shm)->data(), [fd_server, shm = *shm, token = *token, locked = std::move(locked)](std::byte*) mutable {
        locked.reset();  // before the mapping goes with `shm`
        fd_server->Forget(token);
      });
  return gpu::SlotPool::Over(gpu::MemoryKind::kHost, std::move(memory), slot_bytes, slots);
}

void ShmTransport::Locate(uint32_t segment, uint64_t offset,
                          v1::BatchDescriptor* descriptor) const {
  descriptor->mutable_shm()->set_segment(segment);
  descriptor->mutable_shm()->set_offset(offset);
}

}  // namespace conveyor
