// kaldi_cm_kernels.h (CUDA sources only): the assembler's decode ops (assembly_program.h),
// launched from cuda_assembler.cu and compiled in kaldi_cm_device.cu with --fmad=false so
// that the values are Kaldi's bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/assembly_program.h"

namespace conveyor::gpu {

// Expands `n` decode ops (their array in device memory at `ops`, their data in `staging`)
// into `slot`, as float or double values, on `stream`. Returns the launch's error.
cudaError_t LaunchDecodeOps(const DecodeOp* ops, uint64_t n, const std::byte* staging, std::byte* slot, bool double_values,
                            cudaStream_t stream);

}  // namespace conveyor::gpu
