// DeviceCmDecoder: the plan and staging are host code (cm_decode_plan.h), the kernel's body is
// CmDecodeKernel (kernels/cm_decode_kernel.h), launched here. Compiled with --fmad=false
// (cuda/CMakeLists.txt): contraction would change 60-68% of the decoded values (measured with
// FMA contraction on the host, on Kaldi-written CM, CM2 and CM3 archives).
#include "cuda/kaldi_cm_device.h"

#include <algorithm>
#include <memory>

#include "cuda/cm_decode_plan.h"
#include "cuda/cuda_buffer.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/device_launch.cuh"

namespace conveyor::gpu {

struct DeviceCmDecoder::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  CudaBuffer pinned{true}, staging{false};

  ~Impl() {
    // The buffers and the stream are this device's, whichever thread destroys the decoder.
    int previous = 0;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    pinned.Free();
    staging.Free();
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (restore) cudaSetDevice(previous);
    cudaGetLastError();
  }
};

DeviceCmDecoder::DeviceCmDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceCmDecoder::~DeviceCmDecoder() = default;

absl::StatusOr<std::unique_ptr<DeviceCmDecoder>> DeviceCmDecoder::Create(int device) {
  if (absl::Status st = CheckCudaDevice(device); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  return std::unique_ptr<DeviceCmDecoder>(new DeviceCmDecoder(std::move(impl)));
}

absl::Status DeviceCmDecoder::Decode(absl::Span<const CompressedJob> jobs, float* device_out) {
  absl::StatusOr<CmDecodePlan> plan = PlanCmDecode(jobs);
  if (!plan.ok()) return plan.status();
  if (plan->tasks.empty()) return absl::OkStatus();
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));  // both buffers are free
  const uint64_t bytes = std::max<uint64_t>(plan->staging_bytes, 16 << 20);
  if (absl::Status st = impl_->pinned.Reserve(bytes, "pinned CM buffer"); !st.ok()) return st;
  if (absl::Status st = impl_->staging.Reserve(bytes, "device CM buffer"); !st.ok()) return st;
  PackCmDecode(*plan, jobs, impl_->pinned.data);
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl_->staging.data, impl_->pinned.data, plan->staging_bytes,
                                                cudaMemcpyHostToDevice, impl_->stream));
  std::byte* staging = impl_->staging.data;
  const CmDecodeKernel kernel{reinterpret_cast<const CmJob*>(staging + plan->jobs_at),
                              reinterpret_cast<const CmTask*>(staging + plan->tasks_at),
                              static_cast<uint32_t>(plan->tasks.size()), reinterpret_cast<const uint8_t*>(staging),
                              device_out};
  absl::Status launched =
      LaunchPhasedOnDevice(kernel, CmDecodeShape(*plan, kDeviceLaunchPolicy), impl_->stream, "CmDecodeKernel");
  // Also after a failed launch: the copy may still be reading the pinned buffer.
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return launched;
}

absl::Status DeviceCmDecoder::DecodeToHost(absl::Span<const CompressedJob> jobs, float* host_out, uint64_t out_floats) {
  float* device_out = nullptr;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMalloc(&device_out, std::max<uint64_t>(out_floats, 1) * sizeof(float)));
  std::unique_ptr<float, decltype(&cudaFree)> owned(device_out, &cudaFree);
  // Garbage first, so that a value the kernel fails to write shows.
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_out, 0xFF, out_floats * sizeof(float), impl_->stream));
  if (absl::Status st = Decode(jobs, device_out); !st.ok()) return st;
  CONVEYOR_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, device_out, out_floats * sizeof(float), cudaMemcpyDeviceToHost, impl_->stream));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

}  // namespace conveyor::gpu
