#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"

namespace conveyor {

std::unique_ptr<BatchAssembler> SelectAssembler(bool want_cuda, int device, std::string* note,
                                                uint64_t staging_bytes) {
  if (!want_cuda) {
    *note = "assembler: cpu (CUDA not requested)";
    return MakeCpuAssembler();
  }
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    *note = absl::StrCat("assembler: cpu (no CUDA device: ", why, ")");
    return MakeCpuAssembler();
  }
  auto cuda = MakeCudaAssembler(device, staging_bytes);
  if (!cuda.ok()) {
    *note = absl::StrCat("assembler: cpu (", cuda.status().message(), ")");
    return MakeCpuAssembler();
  }
  *note = absl::StrCat("assembler: cuda device ", device);
  return std::move(*cuda);
}

}  // namespace conveyor
