// assembly_program.h: the host half of GPU assembly (plan on the host, one copy, kernels).
// From a BatchPlan and its pieces the host builds an AssemblyProgram: which bytes of the
// parsed chunks go into the staging buffer, the small arrays only the host knows (lengths,
// BPTT mask and flags, nnz per CSC column), and flat descriptor arrays the kernels walk.
// One H2D copy sends the staging buffer; then:
//   1. the slot is zeroed (gaps, padding);
//   2. copy items move staged bytes to their place in the slot (dense values, ids, lengths,
//      mask, flags);
//   3. per CSC stream an exclusive scan of the per-column nnz gives colptr;
//   4. CSC piece ops copy each piece's row indices and values to colptr[first column];
//   5. dense-scatter ops sum a sparse sample's entries into its dense column, in file order;
//   6. CSR streams are transposed from a CSC built in scratch memory (cuSPARSE on the device);
//   7. decode ops expand Kaldi compressed matrices' rows into dense values.
// RunProgramOnHost() executes the same steps on the CPU: it is the executable specification
// of the kernels, tested here against the CPU assembler byte for byte, and it is what the
// GPU results are compared with where a device exists. Pure C++: builds without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/assembler.h"
#include "common/batch/batch_layout.h"

namespace conveyor::gpu {

// Largest copy one thread block does; longer segments are split.
inline constexpr uint64_t kCopyItemBytes = 64 << 10;

// Byte offsets; `src` into the staging buffer, `dst` into the slot.
struct CopyItem {
  uint64_t src = 0, dst = 0, bytes = 0;
};

// A CSC stream's colptr: exclusive scan of `cols + 1` counts (the last one 0) at staging
// offset `counts`, of the colptr's own type (int64 when `wide`, else int32).
struct ScanOp {
  uint64_t counts = 0, cols = 0;
  uint64_t colptr = 0;  // destination offset (slot, or scratch when in_scratch)
  uint32_t wide = 0, in_scratch = 0;
};

// One piece of a CSC stream: `nnz` row indices and values, staged at src_rowind/src_values,
// land at position colptr[first_col] of the stream's rowind/values arrays.
struct CscPieceOp {
  uint64_t src_rowind = 0, src_values = 0, nnz = 0, first_col = 0;
  uint64_t colptr = 0, rowind = 0, values = 0;  // the stream's arrays (slot, or scratch)
  uint32_t wide = 0, in_scratch = 0;
};

// One sparse sample delivered dense: its entries summed, in order, into the zeroed dense
// column at slot offset `dst` (dim values).
struct ScatterOp {
  uint64_t src_rowind = 0, src_values = 0, nnz = 0, dst = 0;
};

// A CSR stream: the CSC in scratch (int32 colptr, cols x dim) transposed into the slot.
struct TransposeOp {
  uint64_t cols = 0, dim = 0, nnz = 0;
  uint64_t csc_colptr = 0, csc_rowind = 0, csc_values = 0;  // scratch offsets
  uint64_t rowptr = 0, colind = 0, values = 0;              // slot offsets
};

// A dense piece left compressed (Kaldi CM, CM2, CM3; ParsedStream::compressed): `rows` x
// `cols` values decoded into the slot at `dst`, row-major. Staged at `src`: CM2 and CM3 the
// rows' stored values, row-major (2 or 1 bytes each); CM the window's column headers (8
// bytes each), then its bytes column by column (`rows` a column). Decoded with Kaldi's
// arithmetic (kaldi_cm_math.h), so the values are the CPU decoder's bit for bit.
struct DecodeOp {
  uint64_t src = 0, dst = 0;
  uint32_t type = 0;  // 1: CM, 2: CM2, 3: CM3
  uint32_t rows = 0, cols = 0;
  float min_value = 0, range = 0;
};

// CM (1-byte) runs shorter than this many rows are decoded on the host: on the device each
// would need its 8-byte column headers staged beside 1 byte a value (2.25x the floats for one
// frame, measured by bench/staging_bench).
inline constexpr uint64_t kCm1DeviceMinRows = 4;

// Bytes of the parsed chunks that go into the staging buffer.
struct HostPack {
  const void* src = nullptr;
  uint64_t dst = 0, bytes = 0;
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
  // Rows of compressed matrices decoded on the host instead (a CM run too short to be worth
  // its column headers), packed from here like any chunk data.
  std::vector<std::vector<std::byte>> host_decoded;
  // Staging offsets of the descriptor arrays (after the payload), for the kernels.
  uint64_t copies_at = 0, csc_pieces_at = 0, scatters_at = 0, decodes_at = 0;
};

// Builds the program for `plan` (made from `pieces`). Errors: InvalidArgument (pieces do not
// match the plan), ResourceExhausted (a CSR stream past int32 offsets).
absl::StatusOr<AssemblyProgram> BuildAssemblyProgram(const BatchPlan& plan, absl::Span<const PieceRef> pieces);

// Writes the staging buffer (program.staging_bytes bytes): host arrays, packed chunk data,
// descriptor arrays.
void PackStaging(const AssemblyProgram& program, std::byte* staging);

// The kernels' semantics on the host: `staging` as PackStaging wrote it, `scratch` of
// program.scratch_bytes, `slot` of program.slot_bytes.
void RunProgramOnHost(const AssemblyProgram& program, const std::byte* staging, std::byte* scratch, std::byte* slot);

// A BatchAssembler that builds the program and runs it on the host: the CUDA assembler's
// logic without a device (tests; a reference for the device results).
std::unique_ptr<BatchAssembler> MakeHostProgramAssembler();

}  // namespace conveyor::gpu
