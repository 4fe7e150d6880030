#include "server/transports/cuda_ipc_transport.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "cuda/ipc.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Transport>> CudaIpcTransport::Create(const v1::Subscribe& subscribe,
                                                                    const TransportEnv& env) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TRANSPORT_CUDA_IPC needs a CUDA device on the daemon's host, and it has none (", why,
        "); subscribe with TRANSPORT_SHARED_MEMORY or TRANSPORT_INLINE"));
  }
  const int device =
      subscribe.has_cuda_device() ? subscribe.cuda_device() : env.options->cuda_device;
  if (device < 0 || device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_device ", device, " is not one of the daemon's ", devices, " CUDA device(s)"));
  }
  return std::unique_ptr<Transport>(new CudaIpcTransport(env, device));
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> CudaIpcTransport::MakeAssembler() {
  return MakeCudaAssembler(device_, options_.staging_bytes);
}

absl::StatusOr<std::unique_ptr<gpu::SlotPool>> CudaIpcTransport::MakeSegment(
    uint32_t id, uint64_t slot_bytes, uint32_t slots, v1::StreamResponse* announcement) {
  auto pool = gpu::SlotPool::Create(gpu::MemoryKind::kDevice, slot_bytes, slots, device_);
  if (!pool.ok()) return pool.status();
  // One allocation per pool: one handle exports every slot.
  auto handle = gpu::ExportIpcHandle((*pool)->base(), device_);
  if (!handle.ok()) return handle.status();
  auto uuid = gpu::DeviceUuid(device_);
  if (!uuid.ok()) return uuid.status();
  v1::CudaIpcSegment* a = announcement->mutable_cuda_segment();
  a->set_id(id);
  a->set_bytes(slot_bytes * slots);
  a->set_handle(*handle);
  a->set_device_uuid(*uuid);
  a->set_device(device_);
  return pool;
}

void CudaIpcTransport::Locate(uint32_t segment, uint64_t offset,
                              v1::BatchDescriptor* descriptor) const {
  descriptor->mutable_cuda_ipc()->set_segment(segment);
  descriptor->mutable_cuda_ipc()->set_offset(offset);
}

}  // namespace conveyor
