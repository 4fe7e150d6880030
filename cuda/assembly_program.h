// assembly_program.h: the host half of GPU assembly (plan on the host, one copy, kernels).
// From a BatchPlan and its pieces the host builds an AssemblyProgram: which bytes of the
// parsed chunks go into the staging buffer, the small arrays only the host knows (lengths,
// BPTT mask and flags, nnz per CSC column), and flat descriptor arrays (program_ops.h) the
// kernels walk. One H2D copy sends the staging buffer; then (program_runner.h):
//   1. the slot is zeroed (gaps, padding);
//   2. copy items move staged bytes to their place in the slot (dense values, ids, lengths,
//      mask, flags);
//   3. per CSC stream an exclusive scan of the per-column nnz gives colptr;
//   4. CSC piece ops copy each piece's row indices and values to colptr[first column];
//   5. dense-scatter ops sum a sparse sample's entries into its dense column, in file order;
//   6. decode ops expand Kaldi compressed matrices' rows into dense values, frames ops HTK
//      frames (sent once each, as they lie in the file) into their context windows;
//   7. CSR streams are transposed from a CSC built in scratch memory (a stable radix sort).
// A batch whose values are narrowed to float16/bfloat16 (value_conversion.h) is assembled as
// its float32 twin in scratch memory, then narrowed into the slot (8. NarrowKernel).
// Long work is split into bounded descriptors (program_ops.h) so that many blocks share it.
// The same kernels run on the host through the host executor (host_program.h), tested
// against the CPU assembler byte for byte. Pure C++: builds without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/assembler.h"
#include "common/batch/batch_layout.h"
#include "common/batch/value_conversion.h"
#include "common/chunk/compressed.h"
#include "cuda/kernels/program_ops.h"

namespace conveyor::gpu {

// CM (1-byte) runs shorter than this many rows are decoded on the host: on the device each
// would need its 8-byte column headers staged beside 1 byte a value (2.25x the floats for one
// frame, measured by bench/staging_bench).
inline constexpr uint64_t kCm1DeviceMinRows = 4;

// Bytes of the parsed chunks that go into the staging buffer: copied from `src`, or, where
// `decode` is set, rows a codec decodes straight into the staging buffer (a few rows of CM, or
// a payload of a codec no device kernel decodes), bit for bit as the CPU assembler does.
struct HostPack {
  const void* src = nullptr;
  uint64_t dst = 0, bytes = 0;
  const CompressedDense* decode = nullptr;  // in a chunk of the program's pieces
  CompressedWindow window;
};

struct AssemblyProgram {
  Precision precision = Precision::kFloat;
  uint64_t value_bytes = 4;
  uint64_t slot_bytes = 0;      // plan.total_bytes: zeroed, then filled
  uint64_t staging_bytes = 0;   // sent host -> device
  uint64_t scratch_bytes = 0;   // device-only (CSR intermediates)
  uint64_t payload_bytes = 0;   // of staging_bytes: data, before the descriptor arrays
  std::vector<std::byte> host_arrays;  // staged at offset 0: lengths, mask, flags, counts
  std::vector<HostPack> packs;
  std::vector<CopyItem> copies;
  std::vector<ScanOp> scans;
  std::vector<CscPieceOp> csc_pieces;
  std::vector<ScatterOp> scatters;
  std::vector<TransposeOp> transposes;
  std::vector<DecodeOp> decodes;
  std::vector<FramesOp> frames;  // HTK frames, their windows built on the device
  // Narrowed values: steps 1-7 build the float32 twin (wide_bytes) at scratch offset wide_at,
  // then the narrow ops fill the slot from it. Empty otherwise.
  std::vector<NarrowOp> narrows;
  uint64_t wide_at = 0, wide_bytes = 0;
  // Staging offsets of the descriptor arrays (after the payload), for the kernels.
  uint64_t copies_at = 0, csc_pieces_at = 0, scatters_at = 0, decodes_at = 0, frames_at = 0, narrows_at = 0;
};

// What programs run so far did (CudaAssembler::stats(), the host executor, gpu_bench).
struct ProgramStats {
  uint64_t programs = 0, launches = 0, scans = 0;
  uint64_t copy_items = 0, csc_piece_ops = 0, scatter_ops = 0, decode_ops = 0, decoded_values = 0, transposes = 0;
  uint64_t frames_ops = 0, frames_values = 0;  // HTK: ops, and the window values they wrote
  uint64_t narrow_ops = 0;
};

// Builds the program for `plan` (made from `pieces`). Errors: InvalidArgument (pieces do not
// match the plan), ResourceExhausted (a CSR stream past int32 offsets).
absl::StatusOr<AssemblyProgram> BuildAssemblyProgram(const BatchPlan& plan, absl::Span<const PieceRef> pieces);

// Writes the staging buffer (program.staging_bytes bytes): host arrays, packed chunk data
// (rows decoded on the host decoded there), descriptor arrays. The chunks of the pieces the
// program was built from must still be held.
void PackStaging(const AssemblyProgram& program, std::byte* staging);

}  // namespace conveyor::gpu
