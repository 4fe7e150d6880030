// The CPU reference assembler: straight copies out of the parsed columns.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"
#include "common/batch/value_conversion.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// Pieces ordered by (row, t0): the order of CSC columns.
std::vector<uint32_t> ColumnOrder(absl::Span<const PieceRef> pieces) {
  std::vector<uint32_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0u);
  auto before = [&](uint32_t a, uint32_t b) {
    return pieces[a].row != pieces[b].row ? pieces[a].row < pieces[b].row : pieces[a].t0 < pieces[b].t0;
  };
  if (!std::is_sorted(order.begin(), order.end(), before)) std::stable_sort(order.begin(), order.end(), before);
  return order;
}

// Sparse CSC of stream `s`: one column per (row, step); steps no piece covers are empty
// columns. colptr is int64 when `wide`, else int32.
template <typename T>
void BuildCsc(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces, const std::vector<uint32_t>& order,
              bool wide, void* colptr_out, int32_t* rowind, T* values) {
  const StreamLayout& L = plan.streams[s];
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  auto* colptr32 = static_cast<int32_t*>(colptr_out);
  auto* colptr64 = static_cast<int64_t*>(colptr_out);
  uint64_t col = 0, nnz = 0;
  auto fill_to = [&](uint64_t end_col) {  // empty columns up to end_col
    for (; col < end_col; ++col) {
      if (wide) colptr64[col] = static_cast<int64_t>(nnz);
      else colptr32[col] = static_cast<int32_t>(nnz);
    }
  };
  for (uint32_t i : order) {
    const PieceRef& p = pieces[i];
    const ParsedStream& ps = p.chunk->streams[s];
    uint64_t b;
    const uint32_t c = PieceSamples(p, s, &b);
    fill_to(p.row * T_len + p.t0);
    for (uint32_t t = 0; t < c; ++t) {
      if (wide) colptr64[col] = static_cast<int64_t>(nnz + ps.nnz_begin[b + t] - ps.nnz_begin[b]);
      else colptr32[col] = static_cast<int32_t>(nnz + ps.nnz_begin[b + t] - ps.nnz_begin[b]);
      ++col;
    }
    const uint64_t nb = ps.nnz_begin[b], ne = ps.nnz_begin[b + c];
    if (ne == nb) continue;  // (an empty vector's data() may be null: no memcpy from it)
    std::memcpy(rowind + nnz, ps.indices.data() + nb, (ne - nb) * sizeof(int32_t));
    std::memcpy(values + nnz, ps.values<T>().data() + nb, (ne - nb) * sizeof(T));
    nnz += ne - nb;
  }
  fill_to(plan.shape.rows * T_len + 1);
}

template <typename T>
void AssembleStream(const BatchPlan& plan, size_t s, absl::Span<const PieceRef> pieces,
                    const std::vector<uint32_t>& order, std::byte* dst) {
  const StreamLayout& L = plan.streams[s];
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  const uint64_t rows = plan.shape.rows;
  if (L.lengths.present()) {
    auto* lengths = reinterpret_cast<int32_t*>(dst + L.lengths.offset);
    std::memset(lengths, 0, rows * sizeof(int32_t));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int32_t end = static_cast<int32_t>(pieces[i].t0 + plan.count(i, s));
      lengths[pieces[i].row] = std::max(lengths[pieces[i].row], end);
    }
  }
  if (L.ids()) {
    auto* out = reinterpret_cast<int32_t*>(dst + L.values.offset);
    std::memset(out, 0, L.values.bytes);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PieceRef& p = pieces[i];
      uint64_t b;
      const uint32_t c = PieceSamples(p, s, &b);
      if (c == 0) continue;
      std::memcpy(out + p.row * T_len + p.t0, p.chunk->streams[s].indices.data() + b, c * sizeof(int32_t));
    }
    return;
  }
  if (L.dense_values()) {
    T* out = reinterpret_cast<T*>(dst + L.values.offset);
    const uint64_t row_values = L.dim;
    // Pieces never overlap: when they cover every (row, step) there is no padding to zero.
    // When each row holds one piece from step 0 (sequence mode without BPTT), only each
    // row's tail past its piece is padding. Otherwise the whole array is zeroed first.
    uint64_t covered = 0;
    bool one_piece_a_row = L.format == StreamFormat::kDense && pieces.size() == rows && plan.shape.steps == 0;
    if (L.format == StreamFormat::kDense) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        covered += plan.count(i, s);
        one_piece_a_row = one_piece_a_row && pieces[i].t0 == 0;
      }
    }
    const bool zero_tails = covered != rows * T_len && one_piece_a_row;
    if (covered != rows * T_len && !one_piece_a_row) std::memset(out, 0, L.values.bytes);
    // Dense copies: a piece whose source and destination both continue the previous one's
    // (consecutive sequences lying back to back in a chunk or a mapped file) extends one copy.
    const std::byte* run_src = nullptr;
    std::byte* run_dst = nullptr;
    size_t run_bytes = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PieceRef& p = pieces[i];
      const ParsedStream& ps = p.chunk->streams[s];
      uint64_t b;
      const uint32_t c = PieceSamples(p, s, &b);
      T* at = out + (p.row * T_len + p.t0) * row_values;
      if (zero_tails && c < T_len) std::memset(at + c * row_values, 0, (T_len - c) * row_values * sizeof(T));
      if (c == 0) continue;
      if (L.format == StreamFormat::kDense && !ps.compressed.empty()) {
        ps.DecodeDense<T>(p.slot, b, c, at);  // Kaldi CM, CM2, CM3 left compressed
        continue;
      }
      if (L.format == StreamFormat::kDense) {
        const std::byte* src = ps.DenseSamples(p.slot, b, sizeof(T));
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
      const T* v = ps.values<T>().data();
      for (uint32_t t = 0; t < c; ++t, at += row_values) {
        for (uint64_t k = ps.nnz_begin[b + t]; k < ps.nnz_begin[b + t + 1]; ++k) at[ps.indices[k]] += v[k];
      }
    }
    if (run_bytes > 0) std::memcpy(run_dst, run_src, run_bytes);
    return;
  }
  if (L.csc()) {
    BuildCsc<T>(plan, s, pieces, order, L.colptr.dtype == DType::kInt64, dst + L.colptr.offset,
                reinterpret_cast<int32_t*>(dst + L.rowind.offset), reinterpret_cast<T*>(dst + L.values.offset));
    return;
  }
  // CSR of the same matrix: build CSC, then count entries per row and place each column's
  // entries in column order (a stable transpose).
  const uint64_t cols = L.columns(rows);
  std::vector<int64_t> colptr(cols + 1);
  std::vector<int32_t> rowind(L.nnz);
  std::vector<T> csc_values(L.nnz);
  BuildCsc<T>(plan, s, pieces, order, true, colptr.data(), rowind.data(), csc_values.data());
  std::vector<uint64_t> next(uint64_t{L.dim} + 1, 0);
  for (int32_t r : rowind) ++next[static_cast<uint64_t>(r) + 1];
  for (uint64_t r = 0; r < L.dim; ++r) next[r + 1] += next[r];
  const bool wide = L.rowptr.dtype == DType::kInt64;
  for (uint64_t r = 0; r <= L.dim; ++r) {
    if (wide) reinterpret_cast<int64_t*>(dst + L.rowptr.offset)[r] = static_cast<int64_t>(next[r]);
    else reinterpret_cast<int32_t*>(dst + L.rowptr.offset)[r] = static_cast<int32_t>(next[r]);
  }
  auto* colind = reinterpret_cast<int32_t*>(dst + L.colind.offset);
  T* values = reinterpret_cast<T*>(dst + L.values.offset);
  for (uint64_t c = 0; c < cols; ++c) {
    for (int64_t k = colptr[c]; k < colptr[c + 1]; ++k) {
      const uint64_t at = next[static_cast<uint64_t>(rowind[k])]++;
      colind[at] = static_cast<int32_t>(c);
      values[at] = csc_values[k];
    }
  }
}

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

class CpuAssembler final : public BatchAssembler {
 public:
  const char* name() const override { return "cpu"; }

  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                        absl::Span<std::byte> dst) override {
    RETURN_IF_ERROR(CheckSlotSize(plan, dst.size()));
    if (!NarrowsValues(plan)) {
      AssembleInto(plan, pieces, dst.data());
      return absl::OkStatus();
    }
    // Float16/bfloat16 values (value_conversion.h): the float32 twin, then narrowed.
    const BatchPlan wide = WidePlan(plan);
    wide_.resize(wide.total_bytes);
    AssembleInto(wide, pieces, wide_.data());
    ZeroGaps(plan, dst.data());
    for (const NarrowOp& op : NarrowOps(wide, plan)) {
      for (uint64_t i = 0; i < op.count; ++i) NarrowElement(op, i, wide_.data(), dst.data());
    }
    return absl::OkStatus();
  }

 private:
  void AssembleInto(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* out) {
    absl::Span<std::byte> dst(out, plan.total_bytes);
    ZeroGaps(plan, dst.data());
    if (plan.mask.present()) {
      const uint64_t T = plan.shape.steps;
      auto* mask = reinterpret_cast<uint8_t*>(dst.data() + plan.mask.offset);
      auto* flags = reinterpret_cast<uint8_t*>(dst.data() + plan.flags.offset);
      std::memset(mask, 0, plan.mask.bytes);
      std::memset(flags, 0, plan.flags.bytes);
      for (size_t i = 0; i < pieces.size(); ++i) {
        const uint32_t c = plan.pieces[i].longest;
        const uint64_t at = pieces[i].row * T + pieces[i].t0;
        std::memset(mask + at, 1, c);
        if (c > 0 && pieces[i].begins) flags[at] |= 1;
        if (c > 0 && pieces[i].ends) flags[at + c - 1] |= 2;
      }
    }
    bool sparse_out = false;  // CSC/CSR streams need the pieces in column order
    for (const StreamLayout& L : plan.streams) sparse_out |= !L.ids() && !L.dense_values();
    const std::vector<uint32_t> order = sparse_out ? ColumnOrder(pieces) : std::vector<uint32_t>();
    for (size_t s = 0; s < plan.streams.size(); ++s) {
      if (plan.precision == Precision::kFloat) {
        AssembleStream<float>(plan, s, pieces, order, dst.data());
      } else {
        AssembleStream<double>(plan, s, pieces, order, dst.data());
      }
    }
  }

  std::vector<std::byte> wide_;  // the float32 twin of a batch with narrowed values
};

}  // namespace

absl::Status CheckSlotSize(const BatchPlan& plan, size_t slot_bytes) {
  if (slot_bytes >= plan.total_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("batch needs ", plan.total_bytes, " bytes, the slot has ", slot_bytes));
}

std::unique_ptr<BatchAssembler> MakeCpuAssembler() { return std::make_unique<CpuAssembler>(); }

}  // namespace conveyor
