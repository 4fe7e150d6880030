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
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/batch_plan.h"
#include "common/chunk/parsed_chunk.h"
#include "common/config/dataset_config.h"

namespace conveyor {

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

// Pieces per range at least when a plan is split over PlanThreads: fewer cost more to hand
// out than to place (a piece takes tens of ns).
inline constexpr size_t kMinPiecesPerPlanRange = 1024;
// Threads a batch's pieces may be placed on, in ranges (PlanBatch): `run` runs task(0..n-1)
// on the calling thread and on any of `workers` - 1 helpers that come to it, and returns when
// every task has returned (a helper that comes later finds nothing left to run).
struct PlanThreads {
  int workers = 1;  // the calling thread's included
  size_t min_range_pieces = kMinPiecesPerPlanRange;  // (tests split the smallest batches)
  std::function<void(size_t, const std::function<void(size_t)>&)> run;
};

// Plans the batch of `pieces` (all from chunks parsed with `streams` and `precision`).
// `layouts` is empty (all native) or one per stream; only sparse streams take kCsr/kDense.
// `value_dtypes` is empty (all native) or one per stream: the native type (kFloat32 for float
// precision, kFloat64 for double), or kFloat16/kBFloat16 for a float dataset's dense or
// sparse values (value_conversion.h says how the assemblers narrow them).
// Errors: InvalidArgument when a frame-mode piece has several samples, a piece falls
// outside its row in BPTT, streams of a BPTT piece differ in length, a layout does not
// apply to its stream; ResourceExhausted past kMaxBatchBytes.
// `recycled`, when given, is a plan its reader is done with: the new plan takes its arrays
// of pieces, counts and entries (left empty there), so that a batch costs no allocation per
// piece (a string-keyed piece's name is copied into the string already there).
// `threads`, when given with helpers, places the pieces of a batch of at least two
// ranges (min_range_pieces each) in ranges on them: the same plan, and the same error (the
// first piece's in error), as on the calling thread alone.
absl::StatusOr<BatchPlan> PlanBatch(const std::vector<StreamConfig>& streams, Precision precision,
                                    const BatchShape& shape, absl::Span<const PieceRef> pieces,
                                    absl::Span<const OutputLayout> layouts = {},
                                    absl::Span<const DType> value_dtypes = {}, BatchPlan* recycled = nullptr,
                                    const PlanThreads* threads = nullptr);

// Checks that the values of a stream of `format` in `precision` may be delivered as `dtype`
// (float16 or bfloat16, float precision, not ids). The message names the stream.
absl::Status CheckValueDType(const std::string& stream, StreamFormat format, Precision precision, DType dtype);

// Checks that `layout` applies to a stream of `format` (message names the stream).
absl::Status CheckLayout(const std::string& stream, StreamFormat format, OutputLayout layout);

// Samples that piece `p` covers of its sequence, whose samples are [first, first + len):
// [*begin, *begin + return value).
inline uint32_t ClipPieceSamples(uint64_t first, uint64_t len, const PieceRef& p, uint64_t* begin) {
  if (p.sample_begin == 0 && p.sample_count == PieceRef::kAll) {  // the whole sequence
    *begin = first;
    return static_cast<uint32_t>(len);
  }
  const uint64_t b = std::min<uint64_t>(p.sample_begin, len);
  const uint64_t e = p.sample_count == PieceRef::kAll ? len : std::min<uint64_t>(len, uint64_t{p.sample_begin} + p.sample_count);
  *begin = first + b;
  return static_cast<uint32_t>(e - b);
}

// Samples that piece `p` covers of a stream whose sequence_begin array is `sequence_begin`:
// [*begin, *begin + return value).
inline uint32_t PieceSampleRange(const uint64_t* sequence_begin, const PieceRef& p, uint64_t* begin) {
  const uint64_t first = sequence_begin[p.slot];
  return ClipPieceSamples(first, sequence_begin[p.slot + 1] - first, p, begin);
}

// Samples of stream `ps` that piece `p` covers: [*begin, *begin + return value); the
// sequence's first sample in *first. Where every sequence of the chunk has one sample of the
// stream (one_sample_each), sequence_begin is not read.
inline uint32_t PieceStreamSamples(const ParsedStream& ps, const PieceRef& p, uint64_t* first, uint64_t* begin) {
  if (ps.one_sample_each) {
    *first = p.slot;
    return ClipPieceSamples(p.slot, 1, p, begin);
  }
  *first = ps.sequence_begin[p.slot];
  return ClipPieceSamples(*first, ps.sequence_begin[p.slot + 1] - *first, p, begin);
}

// Samples of stream `s` that piece `p` covers: [*begin, *begin + return value).
inline uint32_t PieceSamples(const PieceRef& p, size_t s, uint64_t* begin) {
  uint64_t first;
  return PieceStreamSamples(p.chunk->streams[s], p, &first, begin);
}

// Whether piece `b`, read right after `a`, is not the next sequence of a's chunk: a jump.
inline bool Jumps(const PieceRef& a, const PieceRef& b) { return a.chunk != b.chunk || b.slot != a.slot + 1; }
// Whether a batch of `pieces` read with `jumps` jumps is scattered (randomized): then its
// gathers miss the cache unless asked for ahead. Pieces that mostly follow each other (file
// order; a batch crossing a chunk boundary jumps once) are read in order, which the hardware
// prefetches already, and asking for them again only costs.
inline bool ScatteredByJumps(size_t jumps, size_t pieces) { return jumps * 16 > pieces; }

}  // namespace conveyor
