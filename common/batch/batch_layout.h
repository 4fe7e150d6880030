// batch_layout.h: the layout of one batch in memory (docs/design.md section 7) and how to plan
// it. A batch is one contiguous buffer (a slot) with N rows. Per stream, in stream order:
//   dense,  frame mode:    values[N][dim]
//   dense,  sequence mode: lengths[N] (int32), values[N][T][dim] (padding zeroed)
//   sparse, frame mode:    colptr[N+1], rowind[nnz] (int32), values[nnz]
//   sparse, sequence mode: lengths[N], colptr[N*T+1], rowind[nnz], values[nnz]
//                          (column n*T+t is step t of row n; padded steps are empty)
//   ids,    frame mode:    values[N] (int32: one id a sample)
//   ids,    sequence mode: lengths[N], values[N][T] (int32, padding zeroed)
// Truncated BPTT adds, before the streams, mask[N][T] (uint8: 1 valid step, 0 gap) and
// flags[N][T] (uint8: bit 0 a sequence begins at this step, bit 1 one ends there); every
// stream then has T = the truncation length.
// A subscriber may ask for a sparse stream in another layout (OutputLayout):
//   CSR:   rowptr[dim+1], colind[nnz] (int32: the column above), values[nnz] -- the same
//          dim x columns matrix stored by rows; within a row, entries in column order
//   dense: like a dense stream (values[N][dim] or lengths + values[N][T][dim]); entries
//          of one sample with the same index are summed
// colptr/rowptr are int32 unless nnz needs int64. Every array starts 256-byte aligned, and every
// byte of the slot up to total_bytes is defined (gaps and padding are zero), so two
// assemblers can be compared byte for byte.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/parsed_chunk.h"
#include "common/config/dataset_config.h"

namespace conveyor {

enum class DType : uint8_t { kFloat32 = 0, kFloat64 = 1, kInt32 = 2, kInt64 = 3, kUInt8 = 4 };
size_t DTypeSize(DType t);
const char* DTypeName(DType t);

inline constexpr uint64_t kArrayAlignment = 256;

struct ArrayDesc {
  DType dtype = DType::kFloat32;
  uint64_t offset = 0;  // bytes from the start of the slot
  uint64_t bytes = 0;
  std::vector<uint64_t> shape;
  bool present() const { return !shape.empty(); }
};

// How a stream is delivered. kNative: dense as dense, sparse as CSC.
enum class OutputLayout : uint8_t { kNative = 0, kCsc = 1, kCsr = 2, kDense = 3 };
const char* OutputLayoutName(OutputLayout l);

struct StreamLayout {
  std::string name;
  StreamFormat format = StreamFormat::kDense;
  OutputLayout layout = OutputLayout::kNative;  // as delivered (never kCsc: sparse native is CSC)
  uint32_t dim = 0;
  bool sequence_axis = false;  // false in frame mode
  uint64_t max_length = 0;     // T
  uint64_t num_samples = 0;    // real (unpadded) samples in the batch
  uint64_t nnz = 0;            // sparse
  ArrayDesc lengths, values, colptr, rowind;
  ArrayDesc rowptr, colind;  // CSR only
  // Arrays hold a dense [N][T][dim] (or [N][dim]) block: dense streams and sparse-as-dense.
  bool dense_values() const { return format == StreamFormat::kDense || layout == OutputLayout::kDense; }
  bool csr() const { return format == StreamFormat::kSparse && layout == OutputLayout::kCsr; }
  bool csc() const { return format == StreamFormat::kSparse && !dense_values() && !csr(); }
  bool ids() const { return format == StreamFormat::kIds; }
  uint64_t columns(uint64_t rows) const { return rows * (sequence_axis ? max_length : 1); }
};

// One piece of a sequence placed in the batch: samples [sample_begin, sample_begin+count)
// of the parsed sequence (each stream clipped to its own length; count kAll: all of it),
// written to row `row` from time step `t0` on.
struct PieceRef {
  static constexpr uint32_t kAll = UINT32_MAX;
  const ParsedChunk* chunk = nullptr;
  uint32_t slot = 0;  // parsed sequence index within `chunk`
  uint32_t sample_begin = 0;
  uint32_t sample_count = kAll;
  uint32_t row = 0;
  uint32_t t0 = 0;
  bool begins = true, ends = true;
  int64_t frame = -1;  // shown in dumps: the frame of a multi-sample sequence (frame mode)
};

struct BatchShape {
  uint32_t rows = 0;        // N
  uint32_t steps = 0;       // truncated BPTT: T (adds mask and flags); 0: per-stream longest
  bool frame_mode = false;  // no time axis; every piece is at most one sample
};

// Where each piece landed, for readers of the batch (dump, clients).
struct PlacedPiece {
  uint64_t key = 0;
  std::string name;  // string-keyed formats (Kaldi, HTK): the key as written; else empty
  int64_t frame = -1;
  uint32_t row = 0, t0 = 0, sample_begin = 0;
  bool truncated = false;
  uint32_t longest = 0;  // samples of its longest stream
};

struct BatchPlan {
  Precision precision = Precision::kFloat;
  BatchShape shape;
  uint64_t num_sequences = 0;  // pieces
  uint64_t num_samples = 0;    // minibatch-size samples (definesMBSize stream, else longest)
  uint64_t total_bytes = 0;
  ArrayDesc mask, flags;       // truncated BPTT only
  std::vector<StreamLayout> streams;
  std::vector<PlacedPiece> pieces;
  size_t num_streams = 0;
  std::vector<uint32_t> counts;  // [piece][stream]: samples written
  uint32_t count(size_t piece, size_t stream) const { return counts[piece * num_streams + stream]; }
};

// Largest batch a plan may lay out (a sparse stream asked for as dense can be huge).
inline constexpr uint64_t kMaxBatchBytes = uint64_t{16} << 30;

// Plans the batch of `pieces` (all from chunks parsed with `streams` and `precision`).
// `layouts` is empty (all native) or one per stream; only sparse streams take kCsr/kDense.
// Errors: InvalidArgument when a frame-mode piece has several samples, a piece falls
// outside its row in BPTT, streams of a BPTT piece differ in length, a layout does not
// apply to its stream; ResourceExhausted past kMaxBatchBytes.
absl::StatusOr<BatchPlan> PlanBatch(const std::vector<StreamConfig>& streams, Precision precision,
                                    const BatchShape& shape, absl::Span<const PieceRef> pieces,
                                    absl::Span<const OutputLayout> layouts = {});

// Checks that `layout` applies to a stream of `format` (message names the stream).
absl::Status CheckLayout(const std::string& stream, StreamFormat format, OutputLayout layout);

// Samples of stream `s` that piece `p` covers: [*begin, *begin + return value).
inline uint32_t PieceSamples(const PieceRef& p, size_t s, uint64_t* begin) {
  const ParsedStream& ps = p.chunk->streams[s];
  const uint64_t first = ps.sequence_begin[p.slot];
  const uint64_t len = ps.sequence_begin[p.slot + 1] - first;
  const uint64_t b = std::min<uint64_t>(p.sample_begin, len);
  const uint64_t e = p.sample_count == PieceRef::kAll ? len : std::min<uint64_t>(len, uint64_t{p.sample_begin} + p.sample_count);
  *begin = first + b;
  return static_cast<uint32_t>(e - b);
}

}  // namespace conveyor
