// cuda_ipc_transport.h: TRANSPORT_CUDA_IPC. Batches are assembled by the CUDA assembler
// straight into slots of device memory blocks on the subscription's device (one
// gpu::SlotPool each, exported once with cudaIpcGetMemHandle and announced in a
// CudaIpcSegment message); a batch's descriptor names its block and offset. Blocks stay
// until the stream ends: an importer may still have one open.
#pragma once

#include <memory>

#include "server/transports/pooled_transport.h"

namespace conveyor {

class CudaIpcTransport final : public PooledTransport {
 public:
  // The subscription's device: its cuda_device, else the daemon's --device. Errors:
  // FailedPrecondition (the daemon's host has no CUDA device), InvalidArgument (no such
  // device).
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const v1::Subscribe& subscribe,
                                                           const TransportEnv& env);
  const char* name() const override { return "cuda_ipc"; }
  // Assembled where it travels from: the CUDA assembler on the subscription's device.
  absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeAssembler() override;

 private:
  CudaIpcTransport(const TransportEnv& env, int device) : PooledTransport(env), device_(device) {}
  absl::StatusOr<std::unique_ptr<gpu::SlotPool>> MakeSegment(
      uint32_t id, uint64_t slot_bytes, uint32_t slots, v1::StreamResponse* announcement) override;
  void Locate(uint32_t segment, uint64_t offset, v1::BatchDescriptor* descriptor) const override;
  bool releases_idle_segments() const override { return false; }

  const int device_;
};

}  // namespace conveyor
