// batch_layout.h: the layout of one batch in memory (DESIGN.md section 6) and how to plan
// it. A batch is one contiguous buffer (a slot) holding, per stream, in stream order:
//   dense,  frame mode:    values[N][dim]
//   dense,  sequence mode: lengths[N] (int32), values[N][T][dim] (padding zeroed)
//   sparse, frame mode:    colptr[N+1], rowind[nnz] (int32), values[nnz]
//   sparse, sequence mode: lengths[N], colptr[N*T+1], rowind[nnz], values[nnz]
//                          (column n*T+t is step t of sequence n; padded steps are empty)
// colptr is int32 unless nnz needs int64. Every array starts 256-byte aligned, and every
// byte of the slot up to total_bytes is defined (gaps and padding are zero), so two
// assemblers can be compared byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/parsed_chunk.h"
#include "common/config/dataset_config.h"

namespace conveyor {

enum class DType : uint8_t { kFloat32 = 0, kFloat64 = 1, kInt32 = 2, kInt64 = 3 };
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

struct StreamLayout {
  std::string name;
  StreamFormat format = StreamFormat::kDense;
  uint32_t dim = 0;
  bool sequence_axis = false;  // false in frame mode
  uint64_t max_length = 0;     // T
  uint64_t num_samples = 0;    // real (unpadded) samples in the batch
  uint64_t nnz = 0;            // sparse
  ArrayDesc lengths, values, colptr, rowind;
};

// One sequence of a batch: where its parsed data lives.
struct SequenceRef {
  const ParsedChunk* chunk = nullptr;
  uint32_t slot = 0;  // parsed sequence index within `chunk`
};

struct BatchPlan {
  Precision precision = Precision::kFloat;
  uint64_t num_sequences = 0;
  uint64_t num_samples = 0;  // minibatch-size samples (definesMBSize stream, else longest)
  uint64_t total_bytes = 0;
  std::vector<StreamLayout> streams;
  std::vector<uint64_t> keys;  // per sequence
};

// Plans the batch of `sequences` (all from chunks parsed with `streams` and `precision`).
// Errors: InvalidArgument when frame_mode is set and a sequence has more than one sample.
absl::StatusOr<BatchPlan> PlanBatch(const std::vector<StreamConfig>& streams, Precision precision,
                                    bool frame_mode, absl::Span<const SequenceRef> sequences);

}  // namespace conveyor
