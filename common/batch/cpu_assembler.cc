// The CPU reference assembler: straight copies out of the parsed columns.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"

namespace conveyor {
namespace {

template <typename T>
void AssembleStream(const StreamLayout& L, size_t s, absl::Span<const SequenceRef> seqs,
                    std::byte* dst) {
  const uint64_t T_len = L.max_length;
  if (L.lengths.present()) {
    auto* lengths = reinterpret_cast<int32_t*>(dst + L.lengths.offset);
    for (size_t i = 0; i < seqs.size(); ++i)
      lengths[i] = static_cast<int32_t>(seqs[i].chunk->streams[s].num_samples(seqs[i].slot));
  }
  if (L.format == StreamFormat::kDense) {
    T* out = reinterpret_cast<T*>(dst + L.values.offset);
    const uint64_t row = L.dim;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const ParsedStream& ps = seqs[i].chunk->streams[s];
      const uint64_t b = ps.sequence_begin[seqs[i].slot];
      const uint64_t len = ps.sequence_begin[seqs[i].slot + 1] - b;
      T* seq_out = out + i * T_len * row;
      std::memcpy(seq_out, ps.values<T>().data() + b * row, len * row * sizeof(T));
      std::memset(seq_out + len * row, 0, (T_len - len) * row * sizeof(T));
    }
    return;
  }
  // Sparse CSC: one column per (sequence, step); padded steps are empty columns.
  const bool wide = L.colptr.dtype == DType::kInt64;
  auto* colptr32 = reinterpret_cast<int32_t*>(dst + L.colptr.offset);
  auto* colptr64 = reinterpret_cast<int64_t*>(dst + L.colptr.offset);
  auto* rowind = reinterpret_cast<int32_t*>(dst + L.rowind.offset);
  T* values = reinterpret_cast<T*>(dst + L.values.offset);
  uint64_t col = 0, nnz = 0;
  auto put_col = [&](uint64_t v) {
    if (wide) colptr64[col++] = static_cast<int64_t>(v);
    else colptr32[col++] = static_cast<int32_t>(v);
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ParsedStream& ps = seqs[i].chunk->streams[s];
    const uint64_t b = ps.sequence_begin[seqs[i].slot];
    const uint64_t len = ps.sequence_begin[seqs[i].slot + 1] - b;
    const uint64_t nb = ps.nnz_begin[b], ne = ps.nnz_begin[b + len];
    for (uint64_t t = 0; t < len; ++t) {
      put_col(nnz + ps.nnz_begin[b + t] - nb);
    }
    const uint64_t pad = L.sequence_axis ? T_len - len : 0;
    for (uint64_t t = 0; t < pad; ++t) put_col(nnz + ne - nb);
    std::memcpy(rowind + nnz, ps.indices.data() + nb, (ne - nb) * sizeof(int32_t));
    std::memcpy(values + nnz, ps.values<T>().data() + nb, (ne - nb) * sizeof(T));
    nnz += ne - nb;
  }
  put_col(nnz);
}

class CpuAssembler final : public BatchAssembler {
 public:
  const char* name() const override { return "cpu"; }

  absl::Status Assemble(const BatchPlan& plan, absl::Span<const SequenceRef> seqs,
                        absl::Span<std::byte> dst) override {
    if (dst.size() < plan.total_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("batch needs ", plan.total_bytes,
                                                     " bytes, the slot has ", dst.size()));
    }
    // Zero the alignment gaps between arrays (and the tail), so every byte is defined.
    uint64_t cursor = 0;
    auto gap_to = [&](const ArrayDesc& a) {
      if (!a.present()) return;
      std::memset(dst.data() + cursor, 0, a.offset - cursor);
      cursor = a.offset + a.bytes;
    };
    for (const StreamLayout& L : plan.streams) {
      gap_to(L.lengths);
      gap_to(L.colptr);
      gap_to(L.rowind);
      gap_to(L.values);
    }
    std::memset(dst.data() + cursor, 0, plan.total_bytes - cursor);
    for (size_t s = 0; s < plan.streams.size(); ++s) {
      if (plan.precision == Precision::kFloat) {
        AssembleStream<float>(plan.streams[s], s, seqs, dst.data());
      } else {
        AssembleStream<double>(plan.streams[s], s, seqs, dst.data());
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<BatchAssembler> MakeCpuAssembler() { return std::make_unique<CpuAssembler>(); }

}  // namespace conveyor
