// Built when CUDA is off: no device, no CUDA assembler.
#include "cuda/cuda_backend.h"

namespace conveyor {

bool CudaBuilt() { return false; }

int CudaDeviceCount(std::string* why) {
  *why = "this build has no CUDA backend (configure with CONVEYOR_CUDA=ON where nvcc exists)";
  return 0;
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int) {
  return absl::UnimplementedError("this build has no CUDA backend");
}

}  // namespace conveyor
