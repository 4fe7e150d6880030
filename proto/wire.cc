#include "proto/wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/sampling/loader.h"

namespace conveyor {

v1::Format ToProto(StreamFormat f) {
  switch (f) {
    case StreamFormat::kDense:
      return v1::FORMAT_DENSE;
    case StreamFormat::kSparse:
      return v1::FORMAT_SPARSE;
    case StreamFormat::kIds:
      return v1::FORMAT_IDS;
  }
  return v1::FORMAT_DENSE;
}

v1::DType ToProto(DType t) {
  switch (t) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kInt32:
      return v1::DTYPE_INT32;
    case DType::kInt64:
      return v1::DTYPE_INT64;
    case DType::kUInt8:
      return v1::DTYPE_UINT8;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_FLOAT32;
}

v1::Layout ToProto(OutputLayout l) {
  switch (l) {
    case OutputLayout::kNative:
      return v1::LAYOUT_NATIVE;
    case OutputLayout::kCsc:
      return v1::LAYOUT_CSC;
    case OutputLayout::kCsr:
      return v1::LAYOUT_CSR;
    case OutputLayout::kDense:
      return v1::LAYOUT_DENSE;
  }
  return v1::LAYOUT_NATIVE;
}

absl::StatusOr<OutputLayout> LayoutFromProto(v1::Layout l) {
  switch (l) {
    case v1::LAYOUT_NATIVE:
      return OutputLayout::kNative;
    case v1::LAYOUT_CSC:
      return OutputLayout::kCsc;
    case v1::LAYOUT_CSR:
      return OutputLayout::kCsr;
    case v1::LAYOUT_DENSE:
      return OutputLayout::kDense;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown layout ", static_cast<int>(l)));
  }
}

namespace {

void ArrayToProto(const ArrayDesc& a, v1::ArrayRef* out) {
  if (!a.present()) return;
  out->set_dtype(ToProto(a.dtype));
  out->set_offset(a.offset);
  out->set_bytes(a.bytes);
  for (uint64_t d : a.shape) out->add_shape(d);
}

absl::StatusOr<ArrayDesc> ArrayFromProto(const v1::ArrayRef& a, uint64_t total, const std::string& what) {
  ArrayDesc out;
  if (a.shape_size() == 0) return out;
  switch (a.dtype()) {
    case v1::DTYPE_FLOAT32:
      out.dtype = DType::kFloat32;
      break;
    case v1::DTYPE_FLOAT64:
      out.dtype = DType::kFloat64;
      break;
    case v1::DTYPE_INT32:
      out.dtype = DType::kInt32;
      break;
    case v1::DTYPE_INT64:
      out.dtype = DType::kInt64;
      break;
    case v1::DTYPE_UINT8:
      out.dtype = DType::kUInt8;
      break;
    case v1::DTYPE_FLOAT16:
      out.dtype = DType::kFloat16;
      break;
    case v1::DTYPE_BFLOAT16:
      out.dtype = DType::kBFloat16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype"));
  }
  unsigned __int128 n = DTypeSize(out.dtype);
  for (uint64_t d : a.shape()) {
    out.shape.push_back(d);
    n *= d;
    if (n > total) break;
  }
  out.offset = a.offset();
  out.bytes = a.bytes();
  if (n != a.bytes() || a.offset() > total || a.bytes() > total - a.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " does not fit the batch (offset ", a.offset(), ", ",
                                                   a.bytes(), " bytes, batch ", total, " bytes)"));
  }
  return out;
}

}  // namespace

namespace {

// Whether every piece of `plan` is one sample of each stream alone in its row, as
// Pieces.single_sample_rows describes them.
bool SingleSampleRows(const BatchPlan& plan) {
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const PlacedPiece& p = plan.pieces[i];
    if (p.row != i || p.t0 != 0 || p.sample_begin != 0) return false;
  }
  for (uint32_t c : plan.counts)
    if (c != 1) return false;
  return plan.counts.size() == plan.pieces.size() * plan.num_streams;
}

}  // namespace

void PlanToDescriptor(const BatchPlan& plan, v1::BatchDescriptor* out, bool compact) {
  out->set_total_bytes(plan.total_bytes);
  out->set_rows(plan.shape.rows);
  out->set_steps(plan.shape.steps);
  out->set_frame_mode(plan.shape.frame_mode);
  out->set_precision(plan.precision == Precision::kFloat ? v1::PRECISION_FLOAT : v1::PRECISION_DOUBLE);
  out->set_samples(plan.num_samples);
  ArrayToProto(plan.mask, out->mutable_mask());
  ArrayToProto(plan.flags, out->mutable_flags());
  for (const StreamLayout& L : plan.streams) {
    v1::StreamBatch* s = out->add_streams();
    s->set_name(L.name);
    s->set_format(ToProto(L.format));
    s->set_dim(L.dim);
    s->set_sequence_axis(L.sequence_axis);
    s->set_max_length(L.max_length);
    s->set_nnz(L.nnz);
    ArrayToProto(L.lengths, s->mutable_lengths());
    ArrayToProto(L.values, s->mutable_values());
    ArrayToProto(L.colptr, s->mutable_colptr());
    ArrayToProto(L.rowind, s->mutable_rowind());
    ArrayToProto(L.rowptr, s->mutable_rowptr());
    ArrayToProto(L.colind, s->mutable_colind());
    // As delivered: a sparse stream's native layout is CSC.
    s->set_layout(L.format == StreamFormat::kSparse && L.layout == OutputLayout::kNative ? v1::LAYOUT_CSC
                                                                                         : ToProto(L.layout));
  }
  v1::Pieces* q = out->mutable_pieces();
  const int n = static_cast<int>(plan.pieces.size());
  // A batch of thousands of one-sample sequences would otherwise spend most of its
  // descriptor on lists the client can infer (encoded and decoded each batch).
  const bool single = compact && n > 0 && plan.counts.size() <= kMaxImpliedCounts && SingleSampleRows(plan);
  q->set_single_sample_rows(single);
  q->mutable_key()->Reserve(n);
  bool framed = false, truncated = false, named = false;
  for (const PlacedPiece& p : plan.pieces) {
    q->add_key(p.key);
    framed = framed || p.frame >= 0;
    truncated = truncated || p.truncated;
    named = named || !p.name.empty();
  }
  q->set_truncated(truncated);
  if (!single) {
    q->mutable_row()->Reserve(n);
    q->mutable_t0()->Reserve(n);
    q->mutable_sample_begin()->Reserve(n);
    for (const PlacedPiece& p : plan.pieces) {
      q->add_row(p.row);
      q->add_t0(p.t0);
      q->add_sample_begin(p.sample_begin);
    }
    q->mutable_counts()->Add(plan.counts.begin(), plan.counts.end());
  }
  // String keys (Kaldi, HTK): listed when any piece has one (a piece whose chunk has none
  // goes as an empty name), not judged by the first piece alone.
  if (named) {
    q->mutable_name()->Reserve(n);
    for (const PlacedPiece& p : plan.pieces) q->add_name(p.name);
  }
  if (framed) {
    q->mutable_frame()->Reserve(n);
    for (const PlacedPiece& p : plan.pieces) q->add_frame(p.frame);
  }
}

v1::StreamResponse BatchResponse(const Batch& batch, uint64_t serial, const std::string& cursor, bool compact) {
  v1::StreamResponse message;
  v1::BatchDescriptor* d = message.mutable_batch();
  d->set_serial(serial);
  d->set_epoch(batch.epoch);
  d->set_batch(batch.index);
  d->set_end_of_epoch(batch.end_of_epoch);
  d->set_end_of_sweep(batch.end_of_sweep);
  d->set_dropped(batch.dropped);
  d->set_cursor(cursor);
  PlanToDescriptor(batch.plan, d, compact);
  return message;
}

absl::StatusOr<BatchPlan> DescriptorToPlan(const v1::BatchDescriptor& d) {
  BatchPlan plan;
  const uint64_t total = d.total_bytes();
  plan.total_bytes = total;
  plan.shape.rows = d.rows();
  plan.shape.steps = d.steps();
  plan.shape.frame_mode = d.frame_mode();
  if (d.precision() != v1::PRECISION_FLOAT && d.precision() != v1::PRECISION_DOUBLE) {
    return absl::InvalidArgumentError(absl::StrCat("unknown precision ", static_cast<int>(d.precision())));
  }
  plan.precision = d.precision() == v1::PRECISION_DOUBLE ? Precision::kDouble : Precision::kFloat;
  plan.num_samples = d.samples();
  auto mask = ArrayFromProto(d.mask(), total, "mask");
  if (!mask.ok()) return mask.status();
  plan.mask = *mask;
  auto flags = ArrayFromProto(d.flags(), total, "flags");
  if (!flags.ok()) return flags.status();
  plan.flags = *flags;
  using u128 = unsigned __int128;
  for (const ArrayDesc* a : {&plan.mask, &plan.flags}) {
    if (a->present() && (a->dtype != DType::kUInt8 || a->bytes != u128{plan.shape.rows} * plan.shape.steps)) {
      return absl::InvalidArgumentError("the BPTT mask and flags must be uint8 [rows][steps]");
    }
  }
  const DType value_type = plan.precision == Precision::kFloat ? DType::kFloat32 : DType::kFloat64;
  // Values are of the dataset's precision, or narrowed from float32 on request (float16,
  // bfloat16: CheckValueDType's rule).
  auto is_value = [&](const ArrayDesc& a) {
    return a.dtype == value_type ||
           (plan.precision == Precision::kFloat && (a.dtype == DType::kFloat16 || a.dtype == DType::kBFloat16));
  };
  if (d.streams_size() > kMaxStreams) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", d.streams_size(), " streams (at most ", kMaxStreams, ")"));
  }
  for (const v1::StreamBatch& s : d.streams()) {
    StreamLayout L;
    L.name = s.name();
    switch (s.format()) {
      case v1::FORMAT_DENSE:
        L.format = StreamFormat::kDense;
        break;
      case v1::FORMAT_SPARSE:
        L.format = StreamFormat::kSparse;
        break;
      case v1::FORMAT_IDS:
        L.format = StreamFormat::kIds;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("stream '", L.name.substr(0, 64), "': unknown format ", static_cast<int>(s.format())));
    }
    L.dim = s.dim();
    L.sequence_axis = s.sequence_axis();
    L.max_length = s.max_length();
    L.nnz = s.nnz();
    auto layout = LayoutFromProto(s.layout());
    if (!layout.ok()) return absl::InvalidArgumentError(absl::StrCat("stream '", L.name.substr(0, 64), "': ", layout.status().message()));
    if (L.format == StreamFormat::kSparse) {
      L.layout = *layout == OutputLayout::kCsc ? OutputLayout::kNative : *layout;
    } else if (*layout != OutputLayout::kNative && *layout != OutputLayout::kDense) {
      return absl::InvalidArgumentError(absl::StrCat("stream '", L.name.substr(0, 64), "' is not sparse but delivered as ",
                                                     OutputLayoutName(*layout)));
    }
    for (auto [src, dst, what] : {std::make_tuple(&s.lengths(), &L.lengths, "lengths"),
                                  std::make_tuple(&s.values(), &L.values, "values"),
                                  std::make_tuple(&s.colptr(), &L.colptr, "colptr"),
                                  std::make_tuple(&s.rowind(), &L.rowind, "rowind"),
                                  std::make_tuple(&s.rowptr(), &L.rowptr, "rowptr"),
                                  std::make_tuple(&s.colind(), &L.colind, "colind")}) {
      auto a = ArrayFromProto(*src, total, absl::StrCat("stream '", L.name, "' ", what));
      if (!a.ok()) return a.status();
      *dst = *a;
    }
    // The arrays must have the shapes and types the layout implies, so that readers index
    // safely. 128-bit products: a hostile descriptor must not wrap around to a matching size.
    const u128 T = L.sequence_axis ? L.max_length : 1;
    const u128 rows = plan.shape.rows;
    const std::string name = L.name.substr(0, 64);
    auto is_ptr = [](const ArrayDesc& a) { return a.dtype == DType::kInt32 || a.dtype == DType::kInt64; };
    if (L.ids()) {
      if (L.values.bytes != rows * T * 4 || L.values.dtype != DType::kInt32) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': ids do not match rows x T"));
      }
    } else if (L.dense_values()) {
      if (!is_value(L.values) || L.values.bytes != rows * T * L.dim * DTypeSize(L.values.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': values do not match rows x T x dim"));
      }
    } else if (L.csr()) {
      const size_t ptr = L.rowptr.dtype == DType::kInt64 ? 8 : 4;
      if (!is_ptr(L.rowptr) || L.colind.dtype != DType::kInt32 || !is_value(L.values) ||
          L.rowptr.bytes != (u128{L.dim} + 1) * ptr || L.colind.bytes != u128{L.nnz} * 4 ||
          L.values.bytes != u128{L.nnz} * DTypeSize(L.values.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': CSR arrays do not match the batch"));
      }
    } else {
      const size_t ptr = L.colptr.dtype == DType::kInt64 ? 8 : 4;
      if (!is_ptr(L.colptr) || L.rowind.dtype != DType::kInt32 || !is_value(L.values) ||
          L.colptr.bytes != (rows * T + 1) * ptr || L.rowind.bytes != u128{L.nnz} * 4 ||
          L.values.bytes != u128{L.nnz} * DTypeSize(L.values.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': CSC arrays do not match the batch"));
      }
    }
    if (L.sequence_axis ? (L.lengths.bytes != rows * 4 || L.lengths.dtype != DType::kInt32) : L.lengths.present()) {
      return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': lengths do not match the rows"));
    }
    plan.streams.push_back(std::move(L));
  }
  plan.num_streams = plan.streams.size();
  const v1::Pieces& q = d.pieces();
  const size_t n = static_cast<size_t>(q.key_size());
  // Single-sample rows: row i, step 0, the sequence's first sample, one sample a stream.
  const bool single = q.single_sample_rows();
  const size_t listed = single ? 0 : n;
  if (static_cast<size_t>(q.row_size()) != listed || static_cast<size_t>(q.t0_size()) != listed ||
      static_cast<size_t>(q.sample_begin_size()) != listed || (q.frame_size() != 0 && static_cast<size_t>(q.frame_size()) != n) ||
      (q.name_size() != 0 && static_cast<size_t>(q.name_size()) != n) ||
      static_cast<uint64_t>(q.counts_size()) != static_cast<uint64_t>(listed) * plan.num_streams) {
    return absl::InvalidArgumentError(single ? "single-sample rows with the piece lists they imply, or lists of another length"
                                             : "the pieces' lists do not have one entry per piece (and stream)");
  }
  if (n > static_cast<uint64_t>(plan.shape.rows) * std::max<uint64_t>(1, plan.shape.steps)) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", plan.shape.rows, " rows cannot hold ", n, " pieces"));
  }
  if (single && static_cast<uint64_t>(n) * plan.num_streams > kMaxImpliedCounts) {
    return absl::InvalidArgumentError(absl::StrCat("single-sample rows implying ", n, " pieces x ", plan.num_streams,
                                                   " streams (at most ", kMaxImpliedCounts, ")"));
  }
  plan.num_sequences = n;
  plan.pieces.resize(n);
  if (single) {
    // One sample of each stream at step 0 fits a row of every stream whose T is at least 1,
    // and piece i lies in row i: the checks below, made once (failing where they would).
    for (const StreamLayout& L : plan.streams) {
      if (n > 0 && (L.sequence_axis ? L.max_length : 1) < 1) return absl::InvalidArgumentError("a piece runs past its row");
    }
    if (n > plan.shape.rows) return absl::InvalidArgumentError("a piece lies outside the batch's rows");
    plan.counts.assign(n * plan.num_streams, 1);
    const uint32_t longest = plan.num_streams > 0 ? 1 : 0;
    for (size_t i = 0; i < n; ++i) {
      const int k = static_cast<int>(i);
      PlacedPiece& p = plan.pieces[i];
      p.key = q.key(k);
      if (q.name_size() != 0) p.name = q.name(k);
      p.frame = q.frame_size() != 0 ? q.frame(k) : -1;
      p.row = static_cast<uint32_t>(i);
      p.truncated = q.truncated();
      p.longest = longest;
    }
    return plan;
  }
  plan.counts.assign(q.counts().begin(), q.counts().end());
  for (size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(i);
    const uint32_t row = q.row(k);
    if (row >= plan.shape.rows) return absl::InvalidArgumentError("a piece lies outside the batch's rows");
    PlacedPiece& p = plan.pieces[i];
    p.key = q.key(k);
    if (q.name_size() != 0) p.name = q.name(k);
    p.frame = q.frame_size() != 0 ? q.frame(k) : -1;
    p.row = row;
    p.t0 = q.t0(k);
    p.sample_begin = q.sample_begin(k);
    p.truncated = q.truncated();
    for (size_t s = 0; s < plan.num_streams; ++s) {
      const uint32_t c = plan.counts[i * plan.num_streams + s];
      const StreamLayout& L = plan.streams[s];
      const uint64_t T = L.sequence_axis ? L.max_length : 1;
      if (uint64_t{p.t0} + c > T) return absl::InvalidArgumentError("a piece runs past its row");
      p.longest = std::max(p.longest, c);
    }
  }
  return plan;
}

absl::Status ValidateBatchBytes(const BatchPlan& plan, absl::Span<const std::byte> bytes) {
  if (bytes.size() != plan.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch has ", bytes.size(), " bytes, its descriptor says ", plan.total_bytes));
  }
  const std::byte* base = bytes.data();
  auto load32 = [&](uint64_t at) {
    int32_t v;
    std::memcpy(&v, base + at, 4);
    return v;
  };
  for (const StreamLayout& L : plan.streams) {
    const std::string name = L.name.substr(0, 64);
    const uint64_t rows = plan.shape.rows;
    const uint64_t T = L.sequence_axis ? L.max_length : 1;
    if (L.lengths.present()) {
      for (uint64_t r = 0; r < rows; ++r) {
        const int32_t len = load32(L.lengths.offset + r * 4);
        if (len < 0 || static_cast<uint64_t>(len) > T) {
          return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': row ", r, " has length ", len,
                                                         ", more than T = ", T));
        }
      }
    }
    if (L.format != StreamFormat::kSparse || L.dense_values()) continue;
    // Pointers rise from 0 to nnz and indices stay inside the matrix: readers index safely.
    const bool csr = L.csr();
    const ArrayDesc& ptr = csr ? L.rowptr : L.colptr;
    const ArrayDesc& ind = csr ? L.colind : L.rowind;
    const uint64_t outer = csr ? L.dim : rows * T, inner = csr ? rows * T : L.dim;
    const char* what = csr ? "CSR row" : "CSC column";
    int64_t prev = 0;
    for (uint64_t c = 0; c <= outer; ++c) {
      int64_t v;
      if (ptr.dtype == DType::kInt64) {
        std::memcpy(&v, base + ptr.offset + c * 8, 8);
      } else {
        v = load32(ptr.offset + c * 4);
      }
      if ((c == 0 && v != 0) || v < prev || static_cast<uint64_t>(v) > L.nnz ||
          (c == outer && static_cast<uint64_t>(v) != L.nnz)) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", name, "': bad ", what, " pointers"));
      }
      prev = v;
    }
    for (uint64_t k = 0; k < L.nnz; ++k) {
      const int32_t i = load32(ind.offset + k * 4);
      if (i < 0 || static_cast<uint64_t>(i) >= inner) {
        return absl::InvalidArgumentError(
            absl::StrCat("stream '", name, "': ", csr ? "column" : "row", " index out of range"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor
