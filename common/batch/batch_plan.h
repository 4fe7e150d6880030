// batch_plan.h: the description of one batch's memory (docs/design.md section 7): where each
// array of each stream lies in the batch's buffer, its type and shape, and where each piece of
// a sequence landed. The daemon and the clients share it; planning a batch from parsed chunks
// is batch_layout.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config/stream_types.h"

namespace conveyor {

// kFloat16 and kBFloat16 hold 16-bit patterns (half.h) for values a subscriber asked narrowed.
enum class DType : uint8_t { kFloat32 = 0, kFloat64 = 1, kInt32 = 2, kInt64 = 3, kUInt8 = 4, kFloat16 = 5, kBFloat16 = 6 };
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

// Where a piece's entries of a sparse stream lie in its chunk (indices int32, values in the
// dataset's precision, any alignment), found while planning: PlanBatch reads each piece's
// sample and entry range anyway, and a randomized gather would miss the cache on those tables
// again.
struct PieceEntries {
  const std::byte* indices = nullptr;
  const std::byte* values = nullptr;
  uint64_t count = 0;         // entries
  uint64_t first_sample = 0;  // of the piece, in the chunk's samples of the stream (nnz_begin)
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
  // [piece][stream], sparse streams' only (others zero; empty when no stream is sparse), for
  // the CPU assembler: pointers into the pieces' chunks, valid while they are held (the
  // loader clears them when it hands the batch out). Not sent; a plan without them is
  // assembled from the chunks' tables.
  std::vector<PieceEntries> entries;
};

// Largest batch a plan may lay out (a sparse stream asked for as dense can be huge).
inline constexpr uint64_t kMaxBatchBytes = uint64_t{16} << 30;

}  // namespace conveyor
