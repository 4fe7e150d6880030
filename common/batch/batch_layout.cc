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
    case DType::kUInt8:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
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
    case DType::kUInt8:
      return "uint8";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

const char* OutputLayoutName(OutputLayout l) {
  switch (l) {
    case OutputLayout::kNative:
      return "native";
    case OutputLayout::kCsc:
      return "csc";
    case OutputLayout::kCsr:
      return "csr";
    case OutputLayout::kDense:
      return "dense";
  }
  return "?";
}

absl::Status CheckLayout(const std::string& stream, StreamFormat format, OutputLayout layout) {
  if (layout == OutputLayout::kNative) return absl::OkStatus();
  if (format == StreamFormat::kSparse) return absl::OkStatus();
  if (format == StreamFormat::kDense && layout == OutputLayout::kDense) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("stream '", stream, "' is ", StreamFormatName(format),
                                                 ": layout ", OutputLayoutName(layout),
                                                 " applies to sparse streams only"));
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

absl::Status CheckValueDType(const std::string& stream, StreamFormat format, Precision precision, DType dtype) {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", stream, "': values can be delivered as float16 or "
                                                   "bfloat16, not ", DTypeName(dtype)));
  }
  if (format == StreamFormat::kIds) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", stream, "' holds int32 ids: ", DTypeName(dtype),
                                                   " applies to dense and sparse values"));
  }
  if (precision != Precision::kFloat) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", stream, "': ", DTypeName(dtype),
                                                   " is converted from float32; the dataset's precision is double"));
  }
  return absl::OkStatus();
}

namespace {

// The error of piece `p` whose samples of each stream are counts[0..streams) (PlanBatch's
// errors, for this piece), or OK. Only called when a cheap check found something wrong.
absl::Status PieceError(const std::vector<StreamConfig>& streams, const BatchShape& shape, const PieceRef& p,
                        const uint32_t* counts) {
  const bool bptt = shape.steps > 0;
  const uint64_t key = p.chunk->keys[p.slot];
  if (p.row >= shape.rows) return absl::InternalError("piece row outside the batch");
  uint32_t longest = 0;
  for (size_t s = 0; s < streams.size(); ++s) {
    longest = std::max(longest, counts[s]);
    if (shape.frame_mode && counts[s] > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame mode: sequence ", key, " has ", counts[s], " samples of input '", streams[s].name,
          "' in one frame; expected one sample per frame"));
    }
    if (bptt && p.t0 + counts[s] > shape.steps) return absl::InternalError("BPTT piece beyond the truncation length");
  }
  for (size_t s = 0; bptt && s < streams.size(); ++s) {
    if (counts[s] != longest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "truncated BPTT: sequence ", key, " has streams of different lengths; every input of a "
          "sequence must have the same number of samples"));
    }
  }
  return absl::OkStatus();
}

// Per stream, what MeasureStreams() finds over the pieces.
struct StreamExtent {
  uint64_t max_length = 0, num_samples = 0, nnz = 0;
};

// Whether `pieces` are scattered as they come (ScatteredByJumps): only then are their lines
// asked for ahead.
bool ScatteredPieces(absl::Span<const PieceRef> pieces) {
  size_t jumps = 0;
  for (size_t i = 1; i < pieces.size(); ++i) jumps += Jumps(pieces[i - 1], pieces[i]);
  return ScatteredByJumps(jumps, pieces.size());
}

// Pieces [begin, end) placed (plan->pieces, plan->counts, plan->entries, sized for all of
// them), their samples counted into *num_samples, and each stream's extent over them (longest
// piece end, samples, entries) into extents[0..streams) in the same pass. Stops at the first
// piece in error, and returns its error. `scattered`: whether the batch's pieces are read
// scattered (ScatteredPieces), so that their lines are asked for ahead.
absl::Status PlaceRange(const std::vector<StreamConfig>& streams, const BatchShape& shape, size_t value_bytes,
                        const uint8_t* sparse, absl::Span<const PieceRef> pieces, size_t begin, size_t end,
                        bool scattered, BatchPlan* plan, StreamExtent* extents, uint64_t* num_samples_out) {
  int main_stream = -1;
  for (size_t s = 0; s < streams.size(); ++s)
    if (streams[s].defines_mb_size) main_stream = static_cast<int>(s);
  const size_t ns = streams.size();
  const bool bptt = shape.steps > 0;
  const bool any_sparse = !plan->entries.empty();
  // Randomized pieces lie anywhere in their chunks, so each one's key and sample range miss
  // the cache, and then its entry range (sparse). Asked for ahead, in two stages (the second
  // needs the first), the misses of many pieces overlap; the assembler then finds these lines
  // in cache. The distance covers a miss (several hundred ns here). Not in file order.
  const size_t ahead = scattered ? 16 : 0;
  // Inlined by force: GCC takes a function that only prefetches for pure and drops its calls.
  auto prefetch_place = [&](size_t i) __attribute__((always_inline)) {
    const PieceRef& p = pieces[i];
    __builtin_prefetch(&p.chunk->keys[p.slot]);
    for (size_t s = 0; s < ns; ++s) {
      const ParsedStream& ps = p.chunk->streams[s];
      if (ps.one_sample_each) {  // no sample range to read: the entry range at once
        if (sparse[s]) {
          __builtin_prefetch(&ps.nnz_begin[p.slot]);
          __builtin_prefetch(&ps.nnz_begin[p.slot + 1]);  // the next line, one piece in eight
        }
      } else {
        const uint64_t* sb = ps.sequence_begin.data() + p.slot;
        __builtin_prefetch(sb);
        __builtin_prefetch(sb + 1);
      }
      if (!ps.sparse_indices_in_place.empty()) {  // where its entries lie (CBF)
        __builtin_prefetch(&ps.sparse_indices_in_place[p.slot]);
        __builtin_prefetch(&ps.sparse_values_in_place[p.slot]);
      }
    }
  };
  auto prefetch_entries = [&](size_t i) __attribute__((always_inline)) {
    const PieceRef& p = pieces[i];
    for (size_t s = 0; s < ns; ++s) {
      const ParsedStream& ps = p.chunk->streams[s];
      if (sparse[s] && !ps.one_sample_each) {
        __builtin_prefetch(&ps.nnz_begin[ps.sequence_begin[p.slot]]);
        __builtin_prefetch(&ps.nnz_begin[ps.sequence_begin[p.slot + 1]]);
      }
    }
  };
  for (size_t i = begin; i < std::min(end, begin + 2 * ahead); ++i) prefetch_place(i);
  for (size_t i = begin; i < std::min(end, begin + ahead); ++i) prefetch_entries(i);
  uint64_t num_samples = 0;
  for (size_t i = begin; i < end; ++i) {
    if (ahead > 0) {
      if (i + 2 * ahead < end) prefetch_place(i + 2 * ahead);
      if (i + ahead < end) prefetch_entries(i + ahead);
    }
    const PieceRef& p = pieces[i];
    PlacedPiece& pp = plan->pieces[i];
    uint32_t* counts = plan->counts.data() + i * ns;
    pp.key = p.chunk->keys[p.slot];
    // Into the string a recycled plan left there: no allocation once it is long enough.
    if (!p.chunk->names.empty()) pp.name = p.chunk->names[p.slot];
    else if (!pp.name.empty()) pp.name.clear();
    pp.frame = p.frame;
    pp.row = p.row;
    pp.t0 = p.t0;
    pp.sample_begin = p.sample_begin;
    pp.truncated = bptt;
    uint32_t longest = 0, shortest = ns > 0 ? UINT32_MAX : 0;
    for (size_t s = 0; s < ns; ++s) {
      const ParsedStream& ps = p.chunk->streams[s];
      uint64_t first, b;
      const uint32_t c = PieceStreamSamples(ps, p, &first, &b);
      counts[s] = c;
      longest = std::max(longest, c);
      shortest = std::min(shortest, c);
      StreamExtent& x = extents[s];
      x.max_length = std::max<uint64_t>(x.max_length, p.t0 + c);
      x.num_samples += c;
      if (sparse[s] && c > 0) {
        const uint64_t nb = ps.nnz_begin[b], ne = ps.nnz_begin[b + c];
        x.nnz += ne - nb;
        const std::byte *indices = nullptr, *values = nullptr;
        if (ne > nb) {  // (an empty vector's data() may be null: no address from it)
          if (ps.sparse_indices_in_place.empty()) {
            indices = reinterpret_cast<const std::byte*>(ps.indices.data()) + nb * sizeof(int32_t);
            values = ps.ValueBytes(value_bytes) + nb * value_bytes;
          } else {  // where the sequence's entries lie, from its first sample's on
            const uint64_t skip = nb - (b == first ? nb : ps.nnz_begin[first]);
            indices = ps.sparse_indices_in_place[p.slot] + skip * sizeof(int32_t);
            values = ps.sparse_values_in_place[p.slot] + skip * value_bytes;
          }
        }
        plan->entries[i * ns + s] = PieceEntries{indices, values, ne - nb, b};
      } else if (any_sparse) {
        plan->entries[i * ns + s] = PieceEntries{};
      }
    }
    pp.longest = longest;
    // PlanBatch's errors, checked cheaply here and described by PieceError().
    if (p.row >= shape.rows || (shape.frame_mode && longest > 1) ||
        (bptt && (p.t0 + longest > shape.steps || shortest != longest))) {
      if (absl::Status st = PieceError(streams, shape, p, counts); !st.ok()) return st;
    }
    num_samples += main_stream >= 0 ? counts[main_stream] : longest;
  }
  *num_samples_out += num_samples;
  return absl::OkStatus();
}

// Every piece placed (plan->pieces, plan->counts, plan->entries), the batch's samples
// counted, and each stream's extent; in ranges run by `threads` when it has helpers and
// the batch is big enough to split. Ranges are placed independently (each piece's entries
// depend on it alone) and their extents combined in order, so the plan, and the error
// (that of the first piece in error), are the same however the pieces are split.
absl::Status PlacePieces(const std::vector<StreamConfig>& streams, const BatchShape& shape, size_t value_bytes,
                         absl::Span<const PieceRef> pieces, const PlanThreads* threads, BatchPlan* plan,
                         std::vector<StreamExtent>* extents) {
  plan->pieces.resize(pieces.size());
  const size_t ns = streams.size();
  plan->num_streams = ns;
  plan->counts.resize(pieces.size() * ns);
  extents->assign(ns, StreamExtent{});
  std::vector<uint8_t> sparse(ns);
  bool any_sparse = false;
  for (size_t s = 0; s < ns; ++s) {
    sparse[s] = streams[s].format == StreamFormat::kSparse;
    any_sparse = any_sparse || sparse[s];
  }
  // Sized, not cleared first: every piece's entry of every stream is written (a recycled
  // plan's are overwritten, not zeroed and then written).
  if (any_sparse) plan->entries.resize(pieces.size() * ns);
  else plan->entries.clear();  // (a recycled plan's)
  const bool scattered = ScatteredPieces(pieces);
  const size_t ranges = threads == nullptr || !threads->run || threads->workers <= 1
                            ? 1
                            : std::min(pieces.size() / std::max<size_t>(threads->min_range_pieces, 1),
                                       static_cast<size_t>(2 * threads->workers));
  if (ranges <= 1) {
    return PlaceRange(streams, shape, value_bytes, sparse.data(), pieces, 0, pieces.size(), scattered, plan,
                      extents->data(), &plan->num_samples);
  }
  struct Range {
    std::vector<StreamExtent> extents;
    uint64_t num_samples = 0;
    absl::Status status;
  };
  std::vector<Range> out(ranges);
  threads->run(ranges, [&](size_t r) {
    Range& o = out[r];
    o.extents.assign(ns, StreamExtent{});
    const size_t begin = pieces.size() * r / ranges, end = pieces.size() * (r + 1) / ranges;
    o.status = PlaceRange(streams, shape, value_bytes, sparse.data(), pieces, begin, end, scattered, plan,
                          o.extents.data(), &o.num_samples);
  });
  for (const Range& o : out) {
    if (!o.status.ok()) return o.status;  // the first range in error holds the first piece in error
    for (size_t s = 0; s < ns; ++s) {
      StreamExtent& x = (*extents)[s];
      x.max_length = std::max(x.max_length, o.extents[s].max_length);
      x.num_samples += o.extents[s].num_samples;
      x.nnz += o.extents[s].nnz;
    }
    plan->num_samples += o.num_samples;
  }
  return absl::OkStatus();
}

// Stream `sc` as delivered: its output layout (`layout`: null for native) and the type of its
// values (`value_dtype`: null for the precision's own), checked; the type is returned.
absl::StatusOr<DType> DescribeStream(const StreamConfig& sc, Precision precision, const BatchShape& shape,
                                     const OutputLayout* layout, const DType* value_dtype, StreamLayout* L) {
  const DType native = precision == Precision::kFloat ? DType::kFloat32 : DType::kFloat64;
  L->name = sc.name;
  L->format = sc.format;
  L->dim = static_cast<uint32_t>(sc.dim);
  L->sequence_axis = !shape.frame_mode;
  if (layout != nullptr) {
    if (absl::Status st = CheckLayout(L->name, L->format, *layout); !st.ok()) return st;
    if (L->format == StreamFormat::kSparse && *layout != OutputLayout::kCsc) L->layout = *layout;
  }
  if (value_dtype != nullptr && *value_dtype != native) {
    if (absl::Status st = CheckValueDType(L->name, L->format, precision, *value_dtype); !st.ok()) return st;
    return *value_dtype;
  }
  return native;
}

// Stream L's arrays for `n` rows, placed from *cursor on. Errors: ResourceExhausted when
// dense values pass kMaxBatchBytes or CSR's column indices overflow.
absl::Status PlaceStreamArrays(uint64_t n, DType value_type, StreamLayout* L, uint64_t* cursor) {
  const uint64_t T = L->max_length;
  if (L->sequence_axis) Place(&L->lengths, DType::kInt32, {n}, cursor);
  const uint64_t cols = L->sequence_axis ? n * T : n;
  const DType ptr_type = L->nnz > static_cast<uint64_t>(INT32_MAX) ? DType::kInt64 : DType::kInt32;
  if (L->ids()) {
    if (L->sequence_axis) Place(&L->values, DType::kInt32, {n, T}, cursor);
    else Place(&L->values, DType::kInt32, {n}, cursor);
  } else if (L->dense_values()) {
    const unsigned __int128 want = static_cast<unsigned __int128>(cols) * L->dim * DTypeSize(value_type);
    if (want > kMaxBatchBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "stream '", L->name, "' as dense needs ", static_cast<uint64_t>(want >> 20), " MiB for ", cols,
          " samples x dim ", L->dim, " (at most ", kMaxBatchBytes >> 20, " MiB); ask for CSC or CSR"));
    }
    if (L->sequence_axis) {
      Place(&L->values, value_type, {n, T, L->dim}, cursor);
    } else {
      Place(&L->values, value_type, {n, L->dim}, cursor);
    }
  } else if (L->csr()) {
    if (cols > static_cast<uint64_t>(INT32_MAX)) {
      return absl::ResourceExhaustedError(absl::StrCat("stream '", L->name, "': ", cols, " columns do not fit CSR's int32 column indices"));
    }
    Place(&L->rowptr, ptr_type, {uint64_t{L->dim} + 1}, cursor);
    Place(&L->colind, DType::kInt32, {L->nnz}, cursor);
    Place(&L->values, value_type, {L->nnz}, cursor);
  } else {
    Place(&L->colptr, ptr_type, {cols + 1}, cursor);
    Place(&L->rowind, DType::kInt32, {L->nnz}, cursor);
    Place(&L->values, value_type, {L->nnz}, cursor);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BatchPlan> PlanBatch(const std::vector<StreamConfig>& streams, Precision precision,
                                    const BatchShape& shape, absl::Span<const PieceRef> pieces,
                                    absl::Span<const OutputLayout> layouts, absl::Span<const DType> value_dtypes,
                                    BatchPlan* recycled, const PlanThreads* threads) {
  if (!layouts.empty() && layouts.size() != streams.size()) {
    return absl::InternalError("one layout per stream expected");
  }
  if (!value_dtypes.empty() && value_dtypes.size() != streams.size()) {
    return absl::InternalError("one value dtype per stream expected");
  }
  BatchPlan plan;
  if (recycled != nullptr) {  // (moved out: left empty there) every element is written again below
    plan.pieces = std::move(recycled->pieces);
    plan.counts = std::move(recycled->counts);
    plan.entries = std::move(recycled->entries);
  }
  plan.precision = precision;
  plan.shape = shape;
  plan.num_sequences = pieces.size();
  std::vector<StreamExtent> extents;
  const size_t value_bytes = precision == Precision::kFloat ? sizeof(float) : sizeof(double);
  if (absl::Status st = PlacePieces(streams, shape, value_bytes, pieces, threads, &plan, &extents); !st.ok()) {
    return st;
  }
  const uint64_t n = shape.rows;
  uint64_t cursor = 0;
  if (shape.steps > 0) {
    Place(&plan.mask, DType::kUInt8, {n, shape.steps}, &cursor);
    Place(&plan.flags, DType::kUInt8, {n, shape.steps}, &cursor);
  }
  for (size_t s = 0; s < streams.size(); ++s) {
    StreamLayout L;
    absl::StatusOr<DType> value_type =
        DescribeStream(streams[s], precision, shape, layouts.empty() ? nullptr : &layouts[s],
                       value_dtypes.empty() ? nullptr : &value_dtypes[s], &L);
    if (!value_type.ok()) return value_type.status();
    L.max_length = shape.steps > 0 ? shape.steps : shape.frame_mode ? 1 : extents[s].max_length;
    L.num_samples = extents[s].num_samples;
    L.nnz = extents[s].nnz;
    if (absl::Status st = PlaceStreamArrays(n, *value_type, &L, &cursor); !st.ok()) return st;
    plan.streams.push_back(std::move(L));
  }
  plan.total_bytes = AlignUp(cursor);
  if (plan.total_bytes > kMaxBatchBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a batch of ", plan.total_bytes >> 20, " MiB exceeds the ",
                                                     kMaxBatchBytes >> 20, " MiB limit; ask for smaller minibatches"));
  }
  return plan;
}

}  // namespace conveyor
