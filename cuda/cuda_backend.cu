// Built when CUDA is on: the device probe, memory for slot pools, the CUDA assembler.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_assembler.h"
#include "cuda/cuda_backend.h"
#include "cuda/slot_pool.h"

namespace conveyor {

bool CudaBuilt() { return true; }

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();  // clear the error state
    return 0;
  }
  if (n == 0) *why = "no CUDA device present";
  return n;
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int device) {
  gpu::CudaAssemblerOptions options;
  options.device = device;
  auto assembler = gpu::CudaAssembler::Create(options);
  if (!assembler.ok()) return assembler.status();
  return std::unique_ptr<BatchAssembler>(std::move(*assembler));
}

namespace gpu {

absl::StatusOr<void*> AllocateMemory(MemoryKind kind, uint64_t bytes, int device) {
  void* p = nullptr;
  cudaError_t err = cudaSuccess;
  switch (kind) {
    case MemoryKind::kHost:
      p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
      return p;
    case MemoryKind::kPinned:
      err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      break;
    case MemoryKind::kDevice: {
      int previous = 0;
      cudaGetDevice(&previous);
      err = cudaSetDevice(device);
      if (err == cudaSuccess) err = cudaMalloc(&p, bytes);
      cudaSetDevice(previous);
      break;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of ", MemoryKindName(kind),
                                                     " memory", kind == MemoryKind::kDevice ? absl::StrCat(" on device ", device) : "",
                                                     ": ", cudaGetErrorString(err)));
  }
  return p;
}

void FreeMemory(MemoryKind kind, void* ptr, int device) {
  if (ptr == nullptr) return;
  switch (kind) {
    case MemoryKind::kHost: std::free(ptr); return;
    case MemoryKind::kPinned: cudaFreeHost(ptr); return;
    case MemoryKind::kDevice: {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      cudaFree(ptr);
      cudaSetDevice(previous);
      return;
    }
  }
}

absl::Status CopyMemory(void* dst, const void* src, uint64_t bytes) {
  static const bool have_device = [] {
    std::string why;
    return CudaDeviceCount(&why) > 0;
  }();
  if (!have_device) {  // no device, so no device memory: both ends are host memory
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaMemcpy of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace conveyor
