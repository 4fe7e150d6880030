// cuda_backend.h: what the CUDA backend offers the rest of conveyor, whether or not it was
// built: a device probe and the assembler selection. Built without CUDA (CONVEYOR_CUDA=OFF
// or no nvcc), the probe reports no device and MakeCudaAssembler() is Unimplemented; the
// choice is made at run time from what is built and what the machine has.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/batch/assembler.h"

namespace conveyor {

// True when this binary contains the CUDA backend.
bool CudaBuilt();

// The number of usable CUDA devices; 0 with a reason in `why` (not built, no driver, no
// device). Never fails, never throws.
int CudaDeviceCount(std::string* why);

// The CUDA assembler for `device`. Errors: Unimplemented (not built, or the kernels are not
// in this build), FailedPrecondition (no such device).
// `staging_bytes`: the initial size of its two pinned staging buffers (0: the default).
absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int device, uint64_t staging_bytes = 0);

// The assembler to use: CUDA when `want_cuda` and it can be had, otherwise the CPU
// reference. `note` receives one line saying which and why (for the log).
std::unique_ptr<BatchAssembler> SelectAssembler(bool want_cuda, int device, std::string* note,
                                                uint64_t staging_bytes = 0);

}  // namespace conveyor
