// cuda_check.h: every CUDA runtime call checked; failures become absl::Status
// values naming the call, the error and the source file and line.
// Include only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::gpu {

inline absl::Status CudaError(cudaError_t err, const char* call, const char* file, int line) {
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", call, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

// FailedPrecondition unless `device` is a usable CUDA device.
inline absl::Status CheckCudaDevice(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error state
    n = 0;
  }
  if (device >= 0 && device < n) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device, " (", n, " present)"));
}

}  // namespace conveyor::gpu

// Evaluates a cudaError_t expression; returns an Internal status from the enclosing function
// on failure.
#define CONVEYOR_CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                                   \
    const cudaError_t conveyor_cuda_err_ = (expr);                                       \
    if (conveyor_cuda_err_ != cudaSuccess)                                               \
      return ::conveyor::gpu::CudaError(conveyor_cuda_err_, #expr, __FILE__, __LINE__);  \
  } while (0)

// After a kernel launch (`kernel` a string literal): the launch error, if any.
#define CONVEYOR_CUDA_CHECK_LAUNCH(kernel)                                                         \
  do {                                                                                             \
    const cudaError_t conveyor_cuda_err_ = cudaGetLastError();                                     \
    if (conveyor_cuda_err_ != cudaSuccess)                                                         \
      return ::conveyor::gpu::CudaError(conveyor_cuda_err_, "launch of " kernel, __FILE__, __LINE__); \
  } while (0)
