// kaldi_cm_device.h: Kaldi compressed matrices (CM, CM2, CM3) decoded on the GPU, bit for
// bit the floats Kaldi's CPU decoder gives (the arithmetic is kaldi_cm_math.h, compiled with
// --fmad=false). The host scans the objects (kaldi_object.h); their bytes go to the device in
// one copy through pinned memory; one block decodes a CM column (a 256-entry table in shared
// memory, then lookups) or a band of CM2/CM3 rows. The kernel's body is CmDecodeKernel
// (kernels/cm_decode_kernel.h), which the host tests run too (cm_decode_plan.h). The
// assembler's data path decodes with DecodeOpsKernel instead (assembly_program.h), and leaves
// to the host the matrices whose values could be NaN (a non-finite header): a NaN this decoder
// writes is the device's canonical one, not necessarily the CPU decoder's bits.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/formats/kaldi/kaldi_object.h"

namespace conveyor::gpu {

// One scanned compressed matrix: `bytes[offset]` is its first byte (the binary marker), as
// KaldiTable's entries give it; decoded whole, row-major, to `out` + out_offset floats.
struct CompressedJob {
  std::string_view bytes;
  uint64_t offset = 0;
  kaldi::ObjectInfo info;
  uint64_t out_offset = 0;
};

class DeviceCmDecoder {
 public:
  // Errors: Unimplemented (no CUDA backend), FailedPrecondition (no such device), Internal.
  static absl::StatusOr<std::unique_ptr<DeviceCmDecoder>> Create(int device);
  ~DeviceCmDecoder();

  // Decodes every job into device memory `device_out`; returns when done. Errors:
  // InvalidArgument (a job that is not a compressed matrix), Internal (CUDA).
  absl::Status Decode(absl::Span<const CompressedJob> jobs, float* device_out);
  // The same into host memory (copied back), for tests and tools; floats no job covers are
  // NaN (the device buffer starts as 0xFF bytes, so that a value the kernel misses shows).
  absl::Status DecodeToHost(absl::Span<const CompressedJob> jobs, float* host_out, uint64_t out_floats);

 private:
  struct Impl;
  explicit DeviceCmDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::gpu
