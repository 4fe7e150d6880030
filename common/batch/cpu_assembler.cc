// The CPU reference assembler: straight copies out of the parsed columns, split into ranges
// of pieces over borrowed threads when it has helpers (assembler.h).
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"
#include "common/batch/value_conversion.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// Pieces ordered by (row, t0): the order of CSC columns (*order); and whether they are
// scattered in that order (ScatteredByJumps, batch_layout.h: in file order the prefetching
// was half of the dense copy loop's time). Without `order` (no CSC or CSR stream), only
// whether the pieces are scattered as they come.
bool ColumnOrder(absl::Span<const PieceRef> pieces, std::vector<uint32_t>* order) {
  auto before = [&](uint32_t a, uint32_t b) {
    return pieces[a].row != pieces[b].row ? pieces[a].row < pieces[b].row : pieces[a].t0 < pieces[b].t0;
  };
  bool sorted = true;
  size_t jumps = 0;
  for (size_t i = 1; i < pieces.size(); ++i) {
    const PieceRef& a = pieces[i - 1];
    const PieceRef& b = pieces[i];
    sorted = sorted && !(b.row != a.row ? b.row < a.row : b.t0 < a.t0);
    jumps += Jumps(a, b);
  }
  if (sorted || order == nullptr) {
    if (order != nullptr) {
      order->resize(pieces.size());
      std::iota(order->begin(), order->end(), 0u);
    }
    return ScatteredByJumps(jumps, pieces.size());
  }
  order->resize(pieces.size());
  std::iota(order->begin(), order->end(), 0u);
  std::stable_sort(order->begin(), order->end(), before);
  jumps = 0;
  for (size_t o = 1; o < order->size(); ++o) jumps += Jumps(pieces[(*order)[o - 1]], pieces[(*order)[o]]);
  return ScatteredByJumps(jumps, pieces.size());
}

// Randomized pieces lie anywhere in their chunks: a gather asks for the data of the piece
// kAhead places further on before it copies the current one, so the misses overlap instead
// of stalling each copy. At most kPrefetchBytes of a piece (the hardware follows a long one).
constexpr size_t kAhead = 32;
constexpr size_t kPrefetchBytes = 512;

// Always inlined: GCC takes a function that only prefetches for pure and drops its calls.
__attribute__((always_inline)) inline void PrefetchBytes(const std::byte* p, size_t bytes) {
  // Every line of [p, p + n): a step of 64 from p, and the last byte (p need not be aligned).
  const size_t n = std::min(bytes, kPrefetchBytes);
  if (n == 0) return;
  for (size_t at = 0; at < n; at += 64) __builtin_prefetch(p + at);
  __builtin_prefetch(p + n - 1);
}

// Where a range of a CSC stream's pieces (in column order) starts writing: its first
// column and its first entry.
struct CscStart {
  uint64_t col = 0, nnz = 0;
};

// One stream of one parsed chunk, its arrays' addresses read once: consecutive pieces mostly
// come from the same chunk, and the copies between pieces would otherwise make the compiler
// load every address again (a memcpy may write anywhere).
struct StreamView {
  const ParsedChunk* chunk = nullptr;
  const uint64_t* sequence_begin = nullptr;
  const uint64_t* nnz_begin = nullptr;
  const std::byte* indices = nullptr;  // chunk-wide entries, when not in place
  const std::byte* values = nullptr;
  const std::byte* const* indices_in_place = nullptr;  // per slot, when in place (CBF)
  const std::byte* const* values_in_place = nullptr;
  const std::byte* const* dense_in_place = nullptr;  // dense: per slot, when in place
  bool compressed = false;                           // dense: left for the assembler (Kaldi CM, HTK)
  bool one_sample_each = false;                      // sequence_begin[i] == i

  template <typename T>
  void Load(const ParsedChunk* c, size_t s) {
    chunk = c;
    const ParsedStream& ps = c->streams[s];
    sequence_begin = ps.sequence_begin.data();
    nnz_begin = ps.nnz_begin.data();
    indices = reinterpret_cast<const std::byte*>(ps.indices.data());
    values = ps.ValueBytes(sizeof(T));
    indices_in_place = ps.sparse_indices_in_place.empty() ? nullptr : ps.sparse_indices_in_place.data();
    values_in_place = ps.sparse_values_in_place.empty() ? nullptr : ps.sparse_values_in_place.data();
    dense_in_place = ps.in_place.empty() ? nullptr : ps.in_place.data();
    compressed = !ps.compressed.empty();
    one_sample_each = ps.one_sample_each;
  }
  // As ParsedStream::DenseSamples(): a dense stream's sample `b` of slot `slot` onwards.
  template <typename T>
  const std::byte* DenseBytes(uint32_t slot, uint64_t b, uint64_t dim) const {
    return DenseSampleAddress(values, dense_in_place, sequence_begin, slot, b, dim * sizeof(T));
  }
  // As PieceSamples(): the samples of `p` are [*begin, *begin + return value).
  uint32_t Samples(const PieceRef& p, uint64_t* begin) const {
    return one_sample_each ? ClipPieceSamples(p.slot, 1, p, begin) : PieceSampleRange(sequence_begin, p, begin);
  }
  // As ParsedStream::SparseIndexBytes()/SparseValueBytes(): entry `k` of slot `slot` onwards.
  const std::byte* IndexBytes(uint32_t slot, uint64_t k) const {
    return SparseEntryAddress(indices, indices_in_place, sequence_begin, nnz_begin, slot, k, sizeof(int32_t));
  }
  template <typename T>
  const std::byte* ValueBytes(uint32_t slot, uint64_t k) const {
    return SparseEntryAddress(values, values_in_place, sequence_begin, nnz_begin, slot, k, sizeof(T));
  }
};

// Sparse CSC of stream `s`, the pieces order[begin, end) of it, starting at `at`: their
// columns (one per (row, step)) and the empty columns before each (steps no piece covers);
// the range that ends the order also writes the empty columns after it and the closing
// entry. Ptr is colptr's type (int64 when nnz needs it, else int32).
template <typename T, typename Ptr>
void BuildCscAs(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces, const std::vector<uint32_t>& order,
                size_t begin, size_t end, CscStart at, bool scattered, Ptr* colptr, int32_t* rowind, T* values) {
  const StreamLayout& L = plan.streams[s];
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  uint64_t col = at.col, nnz = at.nnz;
  auto fill_to = [&](uint64_t end_col) {  // empty columns up to end_col
    for (; col < end_col; ++col) colptr[col] = static_cast<Ptr>(nnz);
  };
  if (!plan.entries.empty()) {
    // Where each piece's entries lie came with the plan: no table of the chunk is read
    // again, but nnz_begin for the columns of a piece of several samples.
    const size_t ns = plan.num_streams;
    const PieceEntries* const E = plan.entries.data() + s;
    const uint32_t* const counts = plan.counts.data() + s;
    auto prefetch_entries = [&](size_t o) __attribute__((always_inline)) {
      const size_t i = order[o];
      const PieceEntries& e = E[i * ns];
      if (e.count == 0) return;
      PrefetchBytes(e.indices, e.count * sizeof(int32_t));
      PrefetchBytes(e.values, e.count * sizeof(T));
      if (counts[i * ns] > 1) __builtin_prefetch(&pieces[i].chunk->streams[s].nnz_begin[e.first_sample]);
    };
    const size_t ahead = scattered ? kAhead : 0;
    for (size_t o = begin; o < std::min(end, begin + ahead); ++o) prefetch_entries(o);
    for (size_t o = begin; o < end; ++o) {
      if (o + ahead < end && scattered) prefetch_entries(o + ahead);
      const size_t i = order[o];
      const PieceRef& p = pieces[i];
      const PieceEntries& e = E[i * ns];
      const uint32_t c = counts[i * ns];
      fill_to(p.row * T_len + p.t0);
      if (c == 1) {
        colptr[col++] = static_cast<Ptr>(nnz);
      } else if (c > 1) {
        const uint64_t* nb = p.chunk->streams[s].nnz_begin.data() + e.first_sample;
        for (uint32_t t = 0; t < c; ++t) colptr[col++] = static_cast<Ptr>(nnz + nb[t] - nb[0]);
      }
      if (e.count == 0) continue;
      std::memcpy(rowind + nnz, e.indices, e.count * sizeof(int32_t));
      std::memcpy(values + nnz, e.values, e.count * sizeof(T));
      nnz += e.count;
    }
    if (end == order.size()) fill_to(plan.shape.rows * T_len + 1);
    return;
  }
  // A plan without the entries' addresses (one made elsewhere; PlanBatch's plans have them):
  // each piece's entries found through the chunk's tables.
  // Inlined by force: GCC takes a function that only prefetches for pure and drops its calls.
  auto prefetch = [&](const PieceRef& p) __attribute__((always_inline)) {
    const ParsedStream& ps = p.chunk->streams[s];
    uint64_t b;
    const uint32_t c = PieceSamples(p, s, &b);
    const uint64_t nb = ps.nnz_begin[b], ne = ps.nnz_begin[b + c];
    if (ne == nb) return;
    PrefetchBytes(ps.SparseIndexBytes(p.slot, nb), (ne - nb) * sizeof(int32_t));
    PrefetchBytes(ps.SparseValueBytes(p.slot, nb, sizeof(T)), (ne - nb) * sizeof(T));
  };
  const size_t ahead = scattered ? kAhead : 0;
  for (size_t o = begin; o < std::min(end, begin + ahead); ++o) prefetch(pieces[order[o]]);
  StreamView v;
  for (size_t o = begin; o < end; ++o) {
    if (scattered && o + ahead < end) prefetch(pieces[order[o + ahead]]);
    const PieceRef& p = pieces[order[o]];
    if (p.chunk != v.chunk) v.Load<T>(p.chunk, s);
    uint64_t b;
    const uint32_t c = v.Samples(p, &b);
    fill_to(p.row * T_len + p.t0);
    const uint64_t nb = v.nnz_begin[b];
    for (uint32_t t = 0; t < c; ++t) colptr[col++] = static_cast<Ptr>(nnz + v.nnz_begin[b + t] - nb);
    const uint64_t ne = v.nnz_begin[b + c];
    if (ne == nb) continue;  // (an empty vector's data() may be null: no memcpy from it)
    // From the chunk's columns, or from the mapped file where the entries lie (CBF).
    std::memcpy(rowind + nnz, v.IndexBytes(p.slot, nb), (ne - nb) * sizeof(int32_t));
    std::memcpy(values + nnz, v.ValueBytes<T>(p.slot, nb), (ne - nb) * sizeof(T));
    nnz += ne - nb;
  }
  if (end == order.size()) fill_to(plan.shape.rows * T_len + 1);
}

template <typename T>
void BuildCsc(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces, const std::vector<uint32_t>& order,
              size_t begin, size_t end, CscStart at, bool wide, bool scattered, void* colptr_out, int32_t* rowind,
              T* values) {
  if (wide) {
    BuildCscAs<T>(plan, s, pieces, order, begin, end, at, scattered, static_cast<int64_t*>(colptr_out), rowind, values);
  } else {
    BuildCscAs<T>(plan, s, pieces, order, begin, end, at, scattered, static_cast<int32_t*>(colptr_out), rowind, values);
  }
}

// The start of every range of a CSC stream whose pieces (in column order) are cut at
// `cuts` (cuts.front() == 0, cuts.back() == order.size()): one pass over the pieces' entry
// counts.
std::vector<CscStart> CscStarts(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces,
                                const std::vector<uint32_t>& order, const std::vector<size_t>& cuts) {
  const StreamLayout& L = plan.streams[s];
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  std::vector<CscStart> starts(cuts.size() - 1);
  if (starts.size() == 1) return starts;  // one range starts at column 0, entry 0
  CscStart at;
  size_t r = 0;
  for (size_t o = 0; o < order.size(); ++o) {
    while (r < starts.size() && cuts[r] == o) starts[r++] = at;
    const PieceRef& p = pieces[order[o]];
    uint32_t c;
    if (!plan.entries.empty()) {  // (what the plan found: no table read again)
      const size_t k = order[o] * plan.num_streams + s;
      c = plan.counts[k];
      at.nnz += plan.entries[k].count;
    } else {
      const ParsedStream& ps = p.chunk->streams[s];
      uint64_t b;
      c = PieceSamples(p, s, &b);
      at.nnz += ps.nnz_begin[b + c] - ps.nnz_begin[b];
    }
    at.col = std::max(at.col, p.row * T_len + p.t0 + c);  // (pieces in column order: the last one's end)
  }
  while (r < starts.size()) starts[r++] = at;
  return starts;
}

// One stream's share of a batch, made in two steps: Prepare (on the calling thread: lengths,
// what must be zeroed, where ranges start) and Range (any thread: pieces [cuts[r],
// cuts[r+1]) of the stream, in column order for CSC). Ranges write disjoint bytes: dense
// and ids pieces own their (row, step) cells, CSC ranges their columns and entries; a CSR
// stream is one range. So the bytes are the same however the ranges are cut or scheduled.
template <typename T>
class StreamAssembly {
 public:
  StreamAssembly(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces,
                 const std::vector<uint32_t>& order, bool scattered, std::byte* dst)
      : plan_(plan), s_(s), pieces_(pieces), order_(order), scattered_(scattered), dst_(dst), L_(plan.streams[s]),
        T_len_(L_.sequence_axis ? L_.max_length : 1) {}

  // Writes the lengths; appends to `zero` the arrays to clear before any range runs; cuts
  // the pieces into ranges of about `range_bytes` of output each (at most `max_ranges`).
  void Prepare(uint64_t range_bytes, size_t max_ranges, std::vector<absl::Span<std::byte>>* zero) {
    const uint64_t rows = plan_.shape.rows;
    // Each row's length, and what the pieces cover (dense streams): one pass.
    auto* lengths = L_.lengths.present() ? reinterpret_cast<int32_t*>(dst_ + L_.lengths.offset) : nullptr;
    if (lengths != nullptr) std::memset(lengths, 0, rows * sizeof(int32_t));
    const bool dense_format = L_.format == StreamFormat::kDense && L_.dense_values();
    uint64_t covered = 0;
    bool from_step_0 = true;
    if ((lengths != nullptr || dense_format) && !pieces_.empty()) {  // (no counts to offset without pieces)
      const uint32_t* counts = plan_.counts.data() + s_;
      const size_t stride = plan_.num_streams;
      for (size_t i = 0; i < pieces_.size(); ++i) {
        const uint32_t c = counts[i * stride];
        const PieceRef& p = pieces_[i];
        if (lengths != nullptr) lengths[p.row] = std::max(lengths[p.row], static_cast<int32_t>(p.t0 + c));
        covered += c;
        from_step_0 = from_step_0 && p.t0 == 0;
      }
    }
    uint64_t out_bytes = L_.values.bytes;
    if (L_.ids()) {
      zero->push_back(absl::MakeSpan(dst_ + L_.values.offset, L_.values.bytes));
    } else if (L_.dense_values()) {
      // Pieces never overlap: when they cover every (row, step) there is no padding to zero.
      // When each row holds one piece from step 0 (sequence mode without BPTT), only each
      // row's tail past its piece is padding (zeroed by its piece's range). Otherwise the
      // whole array is zeroed first.
      if (!dense_format) covered = 0;  // a sparse stream as dense: its samples are scattered
      const bool one_piece_a_row = dense_format && pieces_.size() == rows && plan_.shape.steps == 0 && from_step_0;
      zero_tails_ = covered != rows * T_len_ && one_piece_a_row;
      if (covered != rows * T_len_ && !one_piece_a_row) {
        zero->push_back(absl::MakeSpan(dst_ + L_.values.offset, L_.values.bytes));
      }
    } else if (L_.csr()) {
      max_ranges = 1;  // built whole: CSC, then a stable transpose
    } else {
      out_bytes += L_.colptr.bytes + L_.rowind.bytes;
    }
    const size_t n = pieces_.size();
    size_t ranges = static_cast<size_t>(std::min<uint64_t>(out_bytes / std::max<uint64_t>(range_bytes, 1) + 1, max_ranges));
    ranges = std::max<size_t>(1, std::min(ranges, n));
    cuts_.resize(ranges + 1);
    for (size_t r = 0; r <= ranges; ++r) cuts_[r] = n * r / ranges;
    if (L_.csc()) csc_starts_ = CscStarts(plan_, s_, pieces_, order_, cuts_);
  }

  size_t ranges() const { return cuts_.size() - 1; }

  void Range(size_t r) {
    const size_t begin = cuts_[r], end = cuts_[r + 1];
    if (L_.ids()) {
      auto* out = reinterpret_cast<int32_t*>(dst_ + L_.values.offset);
      for (size_t i = begin; i < end; ++i) {
        const PieceRef& p = pieces_[i];
        uint64_t b;
        const uint32_t c = PieceSamples(p, s_, &b);
        if (c == 0) continue;
        std::memcpy(out + p.row * T_len_ + p.t0, p.chunk->streams[s_].indices.data() + b, c * sizeof(int32_t));
      }
    } else if (L_.dense_values()) {
      Dense(begin, end);
    } else if (L_.csc()) {
      BuildCsc<T>(plan_, s_, pieces_, order_, begin, end, csc_starts_[r], L_.colptr.dtype == DType::kInt64,
                  scattered_, dst_ + L_.colptr.offset, reinterpret_cast<int32_t*>(dst_ + L_.rowind.offset),
                  reinterpret_cast<T*>(dst_ + L_.values.offset));
    } else {
      Csr();
    }
  }

 private:
  void Dense(size_t begin, size_t end) {
    T* out = reinterpret_cast<T*>(dst_ + L_.values.offset);
    const uint64_t row_values = L_.dim;
    // Dense copies: a piece whose source and destination both continue the previous one's
    // (consecutive sequences lying back to back in a chunk or a mapped file) extends one copy.
    const std::byte* run_src = nullptr;
    std::byte* run_dst = nullptr;
    size_t run_bytes = 0;
    // The source rows of dense pieces copied as they lie (not decoded), asked for ahead when
    // the batch's pieces are scattered (Scattered()).
    const bool prefetching = L_.format == StreamFormat::kDense && scattered_;
    auto prefetch = [&](size_t i) __attribute__((always_inline)) {  // (as in BuildCsc)
      const PieceRef& p = pieces_[i];
      const ParsedStream& ps = p.chunk->streams[s_];
      if (!ps.compressed.empty()) return;
      uint64_t b;
      const uint32_t c = PieceSamples(p, s_, &b);
      if (c > 0) PrefetchBytes(ps.DenseSamples(p.slot, b, sizeof(T)), c * row_values * sizeof(T));
    };
    if (prefetching) {
      for (size_t i = begin; i < std::min(end, begin + kAhead); ++i) prefetch(i);
    }
    StreamView view;
    for (size_t i = begin; i < end; ++i) {
      if (prefetching && i + kAhead < end) prefetch(i + kAhead);
      const PieceRef& p = pieces_[i];
      if (p.chunk != view.chunk) view.Load<T>(p.chunk, s_);
      const ParsedStream& ps = p.chunk->streams[s_];
      uint64_t b;
      const uint32_t c = view.Samples(p, &b);
      T* at = out + (p.row * T_len_ + p.t0) * row_values;
      if (zero_tails_ && c < T_len_) std::memset(at + c * row_values, 0, (T_len_ - c) * row_values * sizeof(T));
      if (c == 0) continue;
      if (L_.format == StreamFormat::kDense && view.compressed) {
        ps.DecodeDense<T>(p.slot, b, c, at);  // left for the assembler (Kaldi CM, HTK frames)
        continue;
      }
      if (L_.format == StreamFormat::kDense) {
        const std::byte* src = view.DenseBytes<T>(p.slot, b, row_values);
        const size_t n = c * row_values * sizeof(T);
        if (run_bytes > 0 && src == run_src + run_bytes && reinterpret_cast<std::byte*>(at) == run_dst + run_bytes) {
          run_bytes += n;
          continue;
        }
        if (run_bytes > 0) std::memcpy(run_dst, run_src, run_bytes);
        run_src = src;
        run_dst = reinterpret_cast<std::byte*>(at);
        run_bytes = n;
        continue;
      }
      // A sparse stream asked for as dense: scatter, summing repeated indices in file order.
      if (ps.sparse_values_in_place.empty()) {
        const T* v = ps.values<T>().data();
        for (uint32_t t = 0; t < c; ++t, at += row_values) {
          for (uint64_t k = ps.nnz_begin[b + t]; k < ps.nnz_begin[b + t + 1]; ++k) at[ps.indices[k]] += v[k];
        }
      } else {  // entries where they lie in the mapped file (any alignment)
        for (uint32_t t = 0; t < c; ++t, at += row_values) {
          for (uint64_t k = ps.nnz_begin[b + t]; k < ps.nnz_begin[b + t + 1]; ++k) {
            at[ps.SparseIndex(p.slot, k)] += ps.template SparseValue<T>(p.slot, k);
          }
        }
      }
    }
    if (run_bytes > 0) std::memcpy(run_dst, run_src, run_bytes);
  }

  // CSR of the same matrix: build CSC, then count entries per row and place each column's
  // entries in column order (a stable transpose).
  void Csr() {
    const uint64_t cols = L_.columns(plan_.shape.rows);
    std::vector<int64_t> colptr(cols + 1);
    std::vector<int32_t> rowind(L_.nnz);
    std::vector<T> csc_values(L_.nnz);
    BuildCsc<T>(plan_, s_, pieces_, order_, 0, order_.size(), CscStart{}, true, scattered_, colptr.data(),
                rowind.data(), csc_values.data());
    std::vector<uint64_t> next(uint64_t{L_.dim} + 1, 0);
    for (int32_t r : rowind) ++next[static_cast<uint64_t>(r) + 1];
    for (uint64_t r = 0; r < L_.dim; ++r) next[r + 1] += next[r];
    const bool wide = L_.rowptr.dtype == DType::kInt64;
    for (uint64_t r = 0; r <= L_.dim; ++r) {
      if (wide) reinterpret_cast<int64_t*>(dst_ + L_.rowptr.offset)[r] = static_cast<int64_t>(next[r]);
      else reinterpret_cast<int32_t*>(dst_ + L_.rowptr.offset)[r] = static_cast<int32_t>(next[r]);
    }
    auto* colind = reinterpret_cast<int32_t*>(dst_ + L_.colind.offset);
    T* values = reinterpret_cast<T*>(dst_ + L_.values.offset);
    for (uint64_t c = 0; c < cols; ++c) {
      for (int64_t k = colptr[c]; k < colptr[c + 1]; ++k) {
        const uint64_t at = next[static_cast<uint64_t>(rowind[k])]++;
        colind[at] = static_cast<int32_t>(c);
        values[at] = csc_values[k];
      }
    }
  }

  const BatchPlan& plan_;
  const size_t s_;
  const absl::Span<const PieceRef> pieces_;
  const std::vector<uint32_t>& order_;
  const bool scattered_;  // Scattered(): gathers are prefetched
  std::byte* const dst_;
  const StreamLayout& L_;
  const uint64_t T_len_;
  bool zero_tails_ = false;
  std::vector<size_t> cuts_{0, 0};
  std::vector<CscStart> csc_starts_;
};

// Zeroes the alignment gaps between `plan`'s arrays (and the tail), so every byte is defined.
void ZeroGaps(const BatchPlan& plan, std::byte* dst) {
  uint64_t cursor = 0;
  auto gap_to = [&](const ArrayDesc& a) {
    if (!a.present()) return;
    std::memset(dst + cursor, 0, a.offset - cursor);
    cursor = a.offset + a.bytes;
  };
  gap_to(plan.mask);
  gap_to(plan.flags);
  for (const StreamLayout& L : plan.streams) {
    gap_to(L.lengths);
    gap_to(L.colptr);
    gap_to(L.rowind);
    gap_to(L.rowptr);
    gap_to(L.colind);
    gap_to(L.values);
  }
  std::memset(dst + cursor, 0, plan.total_bytes - cursor);
}

// Tasks [0, n) taken from one counter by the helpers' jobs and by whoever joins: each task
// runs once. A group may have a setup that makes the tasks and returns n: one helper job is
// submitted at first, and whoever runs the setup (that job, or the joiner if it comes first)
// submits the rest once there are tasks, so that no helper waits for another's setup (a
// helper that finds the setup running leaves; the joiner waits, as it needs the batch). A
// job that starts after the last task was taken returns at once, so Join() never waits for
// a helper busy with other work, only for the setup or tasks already running. Such a late
// job may run after Join() returned and the task's state (a BatchWork, or the caller's
// frame) is gone: it holds the group (shared_ptr), finds the setup done and next_ == n_
// under the lock and never calls setup_ or task_, so nothing they refer to may be touched
// outside them.
class TaskGroup : public std::enable_shared_from_this<TaskGroup> {
 public:
  TaskGroup(size_t n, std::function<void(size_t)> task)
      : n_(n), set_up_(true), task_(std::move(task)) {}
  TaskGroup(AssemblyHelpers* helpers, size_t jobs, std::function<size_t()> setup,
            std::function<void(size_t)> task)
      : helpers_(helpers), jobs_(jobs), setup_(std::move(setup)), task_(std::move(task)) {}

  // Tasks [0, n), with up to `jobs` helper jobs (no more than tasks).
  static std::shared_ptr<TaskGroup> Start(AssemblyHelpers* helpers, int jobs, size_t n,
                                          std::function<void(size_t)> task) {
    auto group = std::make_shared<TaskGroup>(n, std::move(task));
    group->Enqueue(helpers, std::min<size_t>(n, static_cast<size_t>(std::max(0, jobs))));
    return group;
  }
  // The tasks and their number made by `setup`, run first by the first thread to come; up to
  // `jobs` helper jobs in all.
  static std::shared_ptr<TaskGroup> StartAfter(AssemblyHelpers* helpers, int jobs,
                                               std::function<size_t()> setup,
                                               std::function<void(size_t)> task) {
    const size_t want = static_cast<size_t>(std::max(0, jobs));
    auto group = std::make_shared<TaskGroup>(helpers, want, std::move(setup), std::move(task));
    group->Enqueue(helpers, std::min<size_t>(want, 1));
    return group;
  }

  // Runs the setup if no thread has (or waits for it), and the tasks left, on this thread;
  // returns when every task has returned.
  void Join() {
    Work(/*joiner=*/true);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  void Enqueue(AssemblyHelpers* helpers, size_t jobs) {
    for (size_t j = 0; j < jobs; ++j)
      helpers->Help([group = shared_from_this()] { group->Work(/*joiner=*/false); });
  }

  void Work(bool joiner) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!set_up_) {
      if (setting_up_ && !joiner) {  // (only the first job can come before the setup is done)
        first_job_left_ = true;
        return;
      }
      if (setting_up_) {
        done_.wait(lock, [&] { return set_up_; });
      } else {
        setting_up_ = true;
        ++running_;  // (so that Join() waits for what follows, helpers_ used included)
        lock.unlock();
        const size_t n = setup_();
        lock.lock();
        n_ = n;
        set_up_ = true;
        done_.notify_all();  // a joiner waiting for the setup
        // The helpers' other jobs, no more in all than tasks; the first counts unless it left.
        const size_t all = std::min(n, jobs_), have = jobs_ > 0 && !first_job_left_ ? 1 : 0;
        if (all > have) {
          lock.unlock();
          Enqueue(helpers_, all - have);
          lock.lock();
        }
        --running_;
        if (running_ == 0 && next_ >= n_) done_.notify_all();
      }
    }
    while (next_ < n_) {
      const size_t i = next_++;
      ++running_;
      lock.unlock();
      task_(i);
      lock.lock();
      if (--running_ == 0 && next_ >= n_) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable done_;
  AssemblyHelpers* const helpers_ = nullptr;
  const size_t jobs_ = 0;  // with a setup: helper jobs wanted in all
  const std::function<size_t()> setup_;
  size_t n_ = 0, next_ = 0, running_ = 0;
  bool set_up_ = false, setting_up_ = false, first_job_left_ = false;
  const std::function<void(size_t)> task_;
};

// A batch cut into ranges (see StreamAssembly), from its plan: made on the calling thread,
// its ranges run by any.
template <typename T>
class BatchWork {
 public:
  // Writes the gaps, mask and flags, and lengths, and zeroes what must be zeroed (in
  // slices run by `run`); `workers` > 1 cuts streams into ranges of about `range_bytes`.
  BatchWork(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* dst, int workers,
            uint64_t range_bytes, const std::function<void(size_t, const std::function<void(size_t)>&)>& run) {
    ZeroGaps(plan, dst);
    if (plan.mask.present()) {
      const uint64_t steps = plan.shape.steps;
      auto* mask = reinterpret_cast<uint8_t*>(dst + plan.mask.offset);
      auto* flags = reinterpret_cast<uint8_t*>(dst + plan.flags.offset);
      std::memset(mask, 0, plan.mask.bytes);
      std::memset(flags, 0, plan.flags.bytes);
      for (size_t i = 0; i < pieces.size(); ++i) {
        const uint32_t c = plan.pieces[i].longest;
        const uint64_t at = pieces[i].row * steps + pieces[i].t0;
        std::memset(mask + at, 1, c);
        if (c > 0 && pieces[i].begins) flags[at] |= 1;
        if (c > 0 && pieces[i].ends) flags[at + c - 1] |= 2;
      }
    }
    // CSC/CSR streams need the pieces in column order (identity unless BPTT); ColumnOrder()
    // also says whether the batch's gathers are scattered.
    bool sparse_out = false;
    for (const StreamLayout& L : plan.streams) sparse_out |= !L.ids() && !L.dense_values();
    const bool scattered = ColumnOrder(pieces, sparse_out ? &order_ : nullptr);
    // Alone: one range a stream. With helpers: ranges of about range_bytes, a few per worker.
    if (workers <= 1) range_bytes = UINT64_MAX;
    const size_t max_ranges = workers > 1 ? static_cast<size_t>(4 * workers) : 1;
    streams_.reserve(plan.streams.size());
    std::vector<absl::Span<std::byte>> zero;
    for (size_t s = 0; s < plan.streams.size(); ++s) {
      streams_.emplace_back(plan, s, pieces, order_, scattered, dst);
      streams_.back().Prepare(range_bytes, max_ranges, &zero);
      for (size_t r = 0; r < streams_.back().ranges(); ++r) tasks_.emplace_back(s, r);
    }
    // Arrays zeroed before any piece is written, in slices of range_bytes.
    std::vector<absl::Span<std::byte>> slices;
    const uint64_t slice = std::max<uint64_t>(range_bytes, 4096);
    for (absl::Span<std::byte> z : zero) {
      for (uint64_t at = 0; at < z.size(); at += std::min<uint64_t>(slice, z.size() - at)) {
        slices.push_back(z.subspan(at, std::min<uint64_t>(slice, z.size() - at)));
      }
    }
    run(slices.size(), [&](size_t i) { std::memset(slices[i].data(), 0, slices[i].size()); });
  }

  size_t tasks() const { return tasks_.size(); }
  void Task(size_t i) { streams_[tasks_[i].first].Range(tasks_[i].second); }

 private:
  std::vector<uint32_t> order_;
  std::vector<StreamAssembly<T>> streams_;
  std::vector<std::pair<size_t, size_t>> tasks_;  // (stream, range)
};

class CpuAssembler final : public BatchAssembler {
 public:
  explicit CpuAssembler(const CpuAssemblerOptions& options) : options_(options) {}
  ~CpuAssembler() override {
    for (auto& b : begun_) (void)Finish(&b);  // their destinations may still be read
  }
  const char* name() const override { return "cpu"; }
  void set_helpers(AssemblyHelpers* helpers) override { helpers_ = helpers; }
  bool pipelined() const override { return helpers_ != nullptr; }
  bool SplitsBatchesOf(uint64_t bytes) const override {
    return helpers_ != nullptr && bytes >= options_.min_parallel_bytes;
  }

  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                        absl::Span<std::byte> dst) override {
    RETURN_IF_ERROR(CheckSlotSize(plan, dst.size()));
    // A batch of no bytes (no rows, no sparse stream): nothing to write, and its destination
    // may have no memory at all (every array offset would be taken from a null pointer).
    // Begin() sends such a batch here too, so nothing below sees a null destination.
    if (plan.total_bytes == 0) return absl::OkStatus();
    const int workers = Workers(plan, /*now=*/true);  // joined at once: idle helpers only
    auto run = [&](size_t n, const std::function<void(size_t)>& task) { Run(workers, n, task); };
    if (!NarrowsValues(plan)) {
      AssembleInto(plan, pieces, dst.data(), workers, run);
      return absl::OkStatus();
    }
    // Float16/bfloat16 values (value_conversion.h): the float32 twin, then narrowed.
    const BatchPlan wide = WidePlan(plan);
    wide_.resize(wide.total_bytes);
    AssembleInto(wide, pieces, wide_.data(), workers, run);
    ZeroGaps(plan, dst.data());
    const std::vector<NarrowOp> ops = NarrowOps(wide, plan);
    run(ops.size(), [&](size_t k) {
      const NarrowOp& op = ops[k];
      for (uint64_t i = 0; i < op.count; ++i) NarrowElement(op, i, wide_.data(), dst.data());
    });
    return absl::OkStatus();
  }

  // With helpers available (idle ones, or busy ones: parser_pool.h), the batch's ranges are
  // handed to them and Begin() returns; otherwise (or for narrowed values) the batch is
  // assembled at once.
  absl::StatusOr<uint64_t> Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                 absl::Span<std::byte> dst) override {
    RETURN_IF_ERROR(CheckSlotSize(plan, dst.size()));
    Begun b;
    b.fence = ++fences_;
    const int workers = Workers(plan);
    if (workers == 1 || NarrowsValues(plan) || plan.total_bytes == 0) {
      b.status = Assemble(plan, pieces, dst);
    } else if (plan.precision == Precision::kFloat) {
      BeginRanges<float>(plan, pieces, dst, workers, &b);
    } else {
      BeginRanges<double>(plan, pieces, dst, workers, &b);
    }
    begun_.push_back(std::move(b));
    return begun_.back().fence;
  }

  absl::Status Wait(uint64_t fence) override {
    if (fence == 0 || fence > fences_) return absl::InvalidArgumentError(absl::StrCat("no batch was begun as fence ", fence));
    absl::Status st;
    while (!begun_.empty() && begun_.front().fence <= fence) {
      absl::Status s = Finish(&begun_.front());
      if (begun_.front().fence == fence) st = s;
      begun_.pop_front();
    }
    return st;
  }

 private:
  using RunFn = std::function<void(size_t, const std::function<void(size_t)>&)>;
  struct Begun {
    uint64_t fence = 0;
    absl::Status status;
    std::shared_ptr<void> work;        // the batch's ranges (BatchWork<T>)
    std::shared_ptr<TaskGroup> group;  // running them; null: assembled at Begin()
  };

  // Hands a batch's ranges (cut for `workers`) to the helpers; the caller joins at Wait(), its
  // thread planning the next batch meanwhile. The batch's own setup (gaps, lengths, zeroing,
  // where the ranges start) is split over the helpers idle now and joined at once; with none
  // idle, it is the first of the batch's work for whichever thread comes first (the helper
  // once done with the batch before, or the caller at Wait()), not the caller's to do now.
  template <typename T>
  void BeginRanges(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                   absl::Span<std::byte> dst, int workers, Begun* b) {
    const int now = Workers(plan, /*now=*/true);
    if (now > 1) {
      auto run = [&](size_t n, const std::function<void(size_t)>& task) { Run(now, n, task); };
      auto w = std::make_shared<BatchWork<T>>(plan, pieces, dst.data(), workers,
                                              options_.range_bytes, run);
      const size_t n = w->tasks();
      b->group =
          TaskGroup::Start(helpers_, workers - 1, n, [w = w.get()](size_t i) { w->Task(i); });
      b->work = std::move(w);
      return;
    }
    auto w = std::make_shared<std::optional<BatchWork<T>>>();
    // (The assembler outlives its batches' setups: each one runs before its Wait() returns.)
    auto setup = [this, w = w.get(), &plan, pieces, out = dst.data(), workers] {
      const RunFn here = [this](size_t n, const std::function<void(size_t)>& task) {
        Run(1, n, task);
      };
      w->emplace(plan, pieces, out, workers, options_.range_bytes, here);
      return (*w)->tasks();
    };
    b->group = TaskGroup::StartAfter(helpers_, workers - 1, std::move(setup),
                                     [w = w.get()](size_t i) { (*w)->Task(i); });
    b->work = std::move(w);
  }

  static absl::Status Finish(Begun* b) {
    if (b->group != nullptr) b->group->Join();
    b->group.reset();
    b->work.reset();
    return b->status;
  }

  // Threads for `plan`'s batch, the caller's included: helpers only for batches worth
  // splitting, and only as many as are available now for work joined later (Begin(), then
  // Wait()), or, `now`, idle now for work joined at once (a busy helper could not help before
  // the join; its job would only wait in its queue).
  int Workers(const BatchPlan& plan, bool now = false) const {
    if (helpers_ == nullptr || plan.total_bytes < options_.min_parallel_bytes) return 1;
    return 1 + std::max(0, std::min(now ? helpers_->idle() : helpers_->available(), options_.max_helpers));
  }

  // Runs task(0..n-1): on the calling thread alone, or with `workers` - 1 helpers.
  void Run(int workers, size_t n, const std::function<void(size_t)>& task) {
    RunWithHelpers(helpers_, workers - 1, n, task);
  }

  void AssembleInto(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* out, int workers,
                    const RunFn& run) {
    if (plan.precision == Precision::kFloat) {
      BatchWork<float> w(plan, pieces, out, workers, options_.range_bytes, run);
      run(w.tasks(), [&](size_t i) { w.Task(i); });
    } else {
      BatchWork<double> w(plan, pieces, out, workers, options_.range_bytes, run);
      run(w.tasks(), [&](size_t i) { w.Task(i); });
    }
  }

  const CpuAssemblerOptions options_;
  AssemblyHelpers* helpers_ = nullptr;
  std::vector<std::byte> wide_;  // the float32 twin of a batch with narrowed values
  uint64_t fences_ = 0;
  std::deque<Begun> begun_;      // not yet waited for, oldest first
};

}  // namespace

void RunWithHelpers(AssemblyHelpers* helpers, int helper_jobs, size_t n, const std::function<void(size_t)>& task) {
  if (helpers == nullptr || helper_jobs <= 0 || n < 2) {
    for (size_t i = 0; i < n; ++i) task(i);
    return;
  }
  TaskGroup::Start(helpers, std::min<int>(helper_jobs, static_cast<int>(n - 1)), n, task)->Join();
}

absl::Status CheckSlotSize(const BatchPlan& plan, size_t slot_bytes) {
  if (slot_bytes >= plan.total_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("batch needs ", plan.total_bytes, " bytes, the slot has ", slot_bytes));
}

std::unique_ptr<BatchAssembler> MakeCpuAssembler(const CpuAssemblerOptions& options) {
  return std::make_unique<CpuAssembler>(options);
}

}  // namespace conveyor
