// Built when CUDA is on: the device probe through the CUDA runtime.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"

namespace conveyor {

bool CudaBuilt() { return true; }

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky-free error state
    return 0;
  }
  if (n == 0) *why = "no CUDA device present";
  return n;
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int device) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (device < 0 || device >= n) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device, " (", n, " present)"));
  }
  return absl::UnimplementedError("the CUDA assembler kernels are not in this build yet");
}

}  // namespace conveyor
