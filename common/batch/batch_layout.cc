#include "common/batch/batch_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace conveyor {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

namespace {

uint64_t AlignUp(uint64_t x) { return (x + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment; }

void Place(ArrayDesc* a, DType dtype, std::vector<uint64_t> shape, uint64_t* cursor) {
  a->dtype = dtype;
  a->shape = std::move(shape);
  uint64_t n = 1;
  for (uint64_t d : a->shape) n *= d;
  a->offset = AlignUp(*cursor);
  a->bytes = n * DTypeSize(dtype);
  *cursor = a->offset + a->bytes;
}

}  // namespace

absl::StatusOr<BatchPlan> PlanBatch(const std::vector<StreamConfig>& streams, Precision precision,
                                    bool frame_mode, absl::Span<const SequenceRef> sequences) {
  BatchPlan plan;
  plan.precision = precision;
  plan.num_sequences = sequences.size();
  plan.keys.reserve(sequences.size());
  for (const SequenceRef& r : sequences) {
    plan.keys.push_back(r.chunk->keys[r.slot]);
    plan.num_samples += r.chunk->lengths[r.slot];
  }
  const DType value_type = precision == Precision::kFloat ? DType::kFloat32 : DType::kFloat64;
  const uint64_t n = sequences.size();
  uint64_t cursor = 0;
  for (size_t s = 0; s < streams.size(); ++s) {
    StreamLayout L;
    L.name = streams[s].name;
    L.format = streams[s].format;
    L.dim = static_cast<uint32_t>(streams[s].dim);
    L.sequence_axis = !frame_mode;
    for (const SequenceRef& r : sequences) {
      const ParsedStream& ps = r.chunk->streams[s];
      const uint64_t len = ps.num_samples(r.slot);
      if (frame_mode && len > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "frame mode: sequence ", r.chunk->keys[r.slot], " has ", len, " samples of input '",
            L.name, "'; expected one sample per sequence (set frameMode: false)"));
      }
      L.max_length = std::max(L.max_length, len);
      L.num_samples += len;
      if (L.format == StreamFormat::kSparse) {
        const uint64_t b = ps.sequence_begin[r.slot], e = ps.sequence_begin[r.slot + 1];
        L.nnz += ps.nnz_begin[e] - ps.nnz_begin[b];
      }
    }
    if (frame_mode) L.max_length = 1;
    const uint64_t T = L.max_length;
    if (L.sequence_axis) Place(&L.lengths, DType::kInt32, {n}, &cursor);
    if (L.format == StreamFormat::kDense) {
      if (L.sequence_axis) {
        Place(&L.values, value_type, {n, T, L.dim}, &cursor);
      } else {
        Place(&L.values, value_type, {n, L.dim}, &cursor);
      }
    } else {
      const uint64_t cols = L.sequence_axis ? n * T : n;
      const DType ptr_type = L.nnz > static_cast<uint64_t>(INT32_MAX) ? DType::kInt64 : DType::kInt32;
      Place(&L.colptr, ptr_type, {cols + 1}, &cursor);
      Place(&L.rowind, DType::kInt32, {L.nnz}, &cursor);
      Place(&L.values, value_type, {L.nnz}, &cursor);
    }
    plan.streams.push_back(std::move(L));
  }
  plan.total_bytes = AlignUp(cursor);
  return plan;
}

}  // namespace conveyor
