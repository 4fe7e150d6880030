// cbf_cntk_layout.cc: layout 1 of cbf_reader.h, the one CNTK's ctf2bin.py writes (magic
// "cntk_bin", chunks, then the header at the offset the file's last 8 bytes give).
#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/status_macros.h"

namespace conveyor::cbf {
namespace {

// Walks chunk `chunk_id` and checks all of it, item by item, saying where and why it fails:
// the reference for what a chunk must satisfy. Fills `lengths` and `counts` (per delivered
// stream, per sequence); no value is read (a sparse sequence's indices and per-sample counts
// are, to check them). Listing a chunk (CountCntkLayoutChunk) is this walk; decoding one is
// FastWalk, which accepts exactly what this walk accepts and asks it why when it does not.
template <typename T>
absl::Status CheckedWalk(std::string_view bytes, uint64_t base, const CbfFile& file, uint64_t chunk_id,
                         const std::vector<int>& source, const std::string& path,
                         std::vector<uint32_t>* counts_out, std::vector<uint32_t>* lengths_out) {
  const CbfChunkInfo& chunk = file.chunks[chunk_id];
  Reader r(bytes, chunk.offset, chunk.end, base);
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", chunk_id, ", byte ", r.pos(), ": ", what));
  };
  const uint32_t n_seq = chunk.num_sequences;
  const char* lengths_raw = nullptr;
  if (!r.Take(n_seq, 4, &lengths_raw)) return bad("the sequence lengths run past the chunk");
  std::vector<uint32_t>& lengths = *lengths_out;
  lengths.resize(n_seq);
  if (n_seq) std::memcpy(lengths.data(), lengths_raw, 4 * uint64_t{n_seq});
  // Which output stream each file stream feeds (-1: skipped).
  std::vector<int> target(file.streams.size(), -1);
  for (size_t i = 0; i < source.size(); ++i) target[source[i]] = static_cast<int>(i);
  // Samples per (stream, sequence), to drop sequences with none at all.
  std::vector<uint32_t>& counts = *counts_out;
  counts.assign(source.size() * n_seq, 0);
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    for (uint32_t j = 0; j < n_seq; ++j) {
      uint32_t n = 0;
      if (!r.Read(&n)) return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": expected its sample count"));
      if (n > lengths[j]) {
        return bad(absl::StrCat("stream '", info.name, "', sequence ", j, " has ", n, " samples, more than its length ",
                                lengths[j]));
      }
      if (info.format == StreamFormat::kDense) {
        const char* values = nullptr;
        if (!r.Take(uint64_t{n} * info.dim, sizeof(T), &values)) {
          return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": ", n, " samples of dimension ", info.dim,
                                  " run past the chunk"));
        }
      } else {
        int32_t nnz = 0;
        const char *values = nullptr, *indices = nullptr, *per_sample = nullptr;
        if (!r.Read(&nnz) || nnz < 0) return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": expected a non-negative nnz"));
        if (!r.Take(static_cast<uint64_t>(nnz), sizeof(T), &values) || !r.Take(static_cast<uint64_t>(nnz), 4, &indices) ||
            !r.Take(n, 4, &per_sample)) {
          return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": ", nnz, " entries run past the chunk"));
        }
        int64_t sum = 0;
        for (uint32_t t = 0; t < n; ++t) {
          int32_t k = 0;
          std::memcpy(&k, per_sample + 4 * t, 4);
          if (k < 0) return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": a negative entry count"));
          sum += k;
        }
        if (sum != nnz) {
          return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": per-sample counts add up to ", sum,
                                  ", not nnz ", nnz));
        }
        for (int32_t k = 0; k < nnz; ++k) {
          int32_t idx = 0;
          std::memcpy(&idx, indices + 4 * k, 4);
          if (idx < 0 || static_cast<uint32_t>(idx) >= info.dim) {
            return bad(absl::StrCat("stream '", info.name, "', sequence ", j, ": index ", idx, " outside [0, ", info.dim, ")"));
          }
        }
      }
      if (target[s] >= 0) counts[static_cast<size_t>(target[s]) * n_seq + j] = n;
    }
  }
  return absl::OkStatus();
}

// A vector written through a cursor (no per-element capacity check); grown in steps when a
// sequence needs more, cut to what was written at the end.
template <typename V>
class Appender {
 public:
  // Appends to `v` (which keeps what it holds), room made for `expect` more at once.
  Appender(HugeVector<V>* v, uint64_t expect) : v_(v), used_(v->size()) { v_->resize(used_ + expect); }
  // Cut to what was written; the spare room given back when it is large (growth doubles).
  ~Appender() {
    v_->resize(used_);
    if (v_->capacity() > used_ + used_ / 2 + 64) v_->shrink_to_fit();
  }
  // Room for `n` more; a pointer to the first, valid until the next Reserve.
  V* Reserve(uint64_t n) {
    if (v_->size() - used_ < n) v_->resize(std::max<uint64_t>(used_ + n, 2 * v_->size()));
    return v_->data() + used_;
  }
  void Advance(uint64_t n) { used_ += n; }
  V back() const { return (*v_)[used_ - 1]; }

 private:
  HugeVector<V>* const v_;
  uint64_t used_;
};

// Chunk `chunk_id` walked and checked in one tight pass per stream: the same checks as
// CheckedWalk, each sequence's together, and its columns written into `out` (dense values
// and sparse entries stay where they lie: `out` points at them). False, with `out` in no
// defined state, where anything is wrong: CheckedWalk then says what.
template <typename T>
bool FastWalk(std::string_view bytes, uint64_t base, const CbfFile& file, uint64_t chunk_id,
              const std::vector<int>& source, ParsedChunk* out, std::vector<uint32_t>* counts_out,
              std::vector<uint32_t>* lengths_out) {
  const CbfChunkInfo& chunk = file.chunks[chunk_id];
  const uint32_t n_seq = chunk.num_sequences;
  const char* p = bytes.data() + (chunk.offset - base);
  const char* const end = bytes.data() + (chunk.end - base);
  if (uint64_t{n_seq} > static_cast<uint64_t>(end - p) / 4) return false;
  std::vector<uint32_t>& lengths = *lengths_out;
  lengths.resize(n_seq);
  if (n_seq) std::memcpy(lengths.data(), p, 4 * uint64_t{n_seq});
  p += 4 * uint64_t{n_seq};
  std::vector<int> target(file.streams.size(), -1);
  for (size_t i = 0; i < source.size(); ++i) target[source[i]] = static_cast<int>(i);
  std::vector<uint32_t>& counts = *counts_out;
  counts.assign(source.size() * n_seq, 0);
  out->streams.resize(source.size());
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    const bool kept = target[s] >= 0;
    ParsedStream* ps = kept ? &out->streams[target[s]] : nullptr;
    uint32_t* count = kept ? counts.data() + static_cast<size_t>(target[s]) * n_seq : nullptr;
    uint64_t* begin = nullptr;
    const std::byte** where = nullptr;
    const std::byte** where_indices = nullptr;
    if (kept) {
      ps->format = info.format;
      ps->dim = info.dim;
      ps->sequence_begin.resize(uint64_t{n_seq} + 1);
      begin = ps->sequence_begin.data();
      begin[0] = 0;
      HugeVector<const std::byte*>& values = info.format == StreamFormat::kDense ? ps->in_place : ps->sparse_values_in_place;
      values.resize(n_seq);
      where = values.data();
      if (info.format == StreamFormat::kSparse) {
        ps->sparse_indices_in_place.resize(n_seq);
        where_indices = ps->sparse_indices_in_place.data();
      }
    }
    if (info.format == StreamFormat::kDense) {
      uint64_t row_bytes = 0;
      if (__builtin_mul_overflow(uint64_t{info.dim}, sizeof(T), &row_bytes)) return false;
      for (uint32_t j = 0; j < n_seq; ++j) {
        if (end - p < 4) return false;
        const uint32_t n = Load<uint32_t>(p);
        p += 4;
        uint64_t need = 0;
        if (n > lengths[j] || __builtin_mul_overflow(uint64_t{n}, row_bytes, &need) ||
            need > static_cast<uint64_t>(end - p)) {
          return false;
        }
        if (kept) {
          where[j] = reinterpret_cast<const std::byte*>(p);  // used where it lies
          begin[j + 1] = begin[j] + n;
          count[j] = n;
        }
        p += need;
      }
      continue;
    }
    // Sparse: u32 n, i32 nnz, T values[nnz], i32 indices[nnz], i32 per_sample[n].
    std::optional<Appender<uint64_t>> entry_begin;
    if (kept) entry_begin.emplace(&ps->nnz_begin, n_seq);  // a sample a sequence to start
    for (uint32_t j = 0; j < n_seq; ++j) {
      if (end - p < 8) return false;
      const uint32_t n = Load<uint32_t>(p);
      const int32_t nnz = Load<int32_t>(p + 4);
      p += 8;
      if (n > lengths[j] || nnz < 0) return false;
      const uint64_t entries = static_cast<uint64_t>(nnz);
      // At most 2^31 * 12 + 2^32 * 4 bytes: no overflow.
      if (entries * (sizeof(T) + 4) + uint64_t{n} * 4 > static_cast<uint64_t>(end - p)) return false;
      const char* values = p;
      const char* indices = values + entries * sizeof(T);
      const char* per_sample = indices + entries * 4;
      p = per_sample + uint64_t{n} * 4;
      if (!IndicesBelow(indices, entries, info.dim)) return false;
      uint64_t* nb = kept ? entry_begin->Reserve(n) : nullptr;
      uint64_t running = kept ? entry_begin->back() : 0;
      const uint64_t first = running;
      int32_t signs = 0;
      for (uint32_t t = 0; t < n; ++t) {
        const int32_t k = Load<int32_t>(per_sample + 4 * uint64_t{t});
        signs |= k;
        running += static_cast<uint32_t>(k);
        if (kept) nb[t] = running;
      }
      // Counts of at most 2^31 - 1 each, n < 2^32 of them: the sum fits 64 bits.
      if (signs < 0 || running - first != entries) return false;
      if (kept) {
        entry_begin->Advance(n);
        where[j] = reinterpret_cast<const std::byte*>(values);  // used where they lie
        where_indices[j] = reinterpret_cast<const std::byte*>(indices);
        begin[j + 1] = begin[j] + n;
        count[j] = n;
      }
    }
  }
  return true;
}

template <typename T>
absl::Status DecodeChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index,
                         uint64_t chunk_id, const std::vector<int>& source, const std::string& path,
                         ParsedChunk* out) {
  std::vector<uint32_t> counts, lengths;
  if (!FastWalk<T>(bytes, base, file, chunk_id, source, out, &counts, &lengths)) {
    out->streams.clear();
    RETURN_IF_ERROR(CheckedWalk<T>(bytes, base, file, chunk_id, source, path, &counts, &lengths));
    // The checked walk accepts the chunk the fast one refused: a bug here, not in the file.
    return absl::InternalError(absl::StrCat(path, ": chunk ", chunk_id,
                                            ": the CBF decoder refused a chunk its checked walk accepts"));
  }
  FinishChunk(counts, lengths, index, index.chunks[chunk_id], out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CbfFile> ReadCntkLayout(std::string_view bytes, const std::string& path) {
  auto bad = BadHeader(path);
  const uint64_t size = bytes.size();
  Reader head(bytes, 8, size);
  uint64_t magic = 0;
  uint32_t version = 0;
  if (!head.Read(&version)) return bad(8, "expected the format version");
  if (version != 1) return bad(8, absl::StrCat("format version ", version, "; only version 1 is defined"));
  if (size < 12 + 8) return bad(size, "the file ends before its header offset");
  int64_t header_offset = 0;
  std::memcpy(&header_offset, bytes.data() + size - 8, 8);
  if (header_offset < 12 || static_cast<uint64_t>(header_offset) > size - 8) {
    return bad(size - 8, absl::StrCat("header offset ", header_offset, " lies outside the file"));
  }
  CbfFile file;
  file.header_offset = static_cast<uint64_t>(header_offset);
  Reader r(bytes, file.header_offset, size - 8);
  uint32_t num_chunks = 0, num_streams = 0;
  if (!r.Read(&magic) || magic != kCbfMagic) return bad(file.header_offset, "expected the header's magic number");
  if (!r.Read(&num_chunks) || !r.Read(&num_streams)) return bad(r.pos(), "the header ends before its counts");
  if (num_streams == 0) return bad(r.pos() - 4, "the file declares no stream");
  if (num_streams > r.left() / 10) return bad(r.pos() - 4, absl::StrCat(num_streams, " streams cannot fit the header"));
  for (uint32_t s = 0; s < num_streams; ++s) {
    CbfStreamInfo info;
    uint8_t matrix_type = 0, elem_type = 0;
    uint32_t name_len = 0;
    const char* name = nullptr;
    const uint64_t at = r.pos();
    if (!r.Read(&matrix_type) || !r.Read(&name_len) || !r.Take(name_len, 1, &name) || !r.Read(&elem_type) ||
        !r.Read(&info.dim)) {
      return bad(at, absl::StrCat("stream ", s, "'s description runs past the header"));
    }
    if (matrix_type > 1) return bad(at, absl::StrCat("stream ", s, " has matrix type ", int{matrix_type}, " (expected 0 dense or 1 sparse)"));
    if (elem_type > 1) return bad(at, absl::StrCat("stream ", s, " has element type ", int{elem_type}, " (expected 0 float or 1 double)"));
    if (name_len == 0 || info.dim == 0) return bad(at, absl::StrCat("stream ", s, " has an empty name or dimension 0"));
    info.name.assign(name, name_len);
    info.format = matrix_type == 0 ? StreamFormat::kDense : StreamFormat::kSparse;
    info.precision = elem_type == 0 ? Precision::kFloat : Precision::kDouble;
    for (const auto& other : file.streams) {
      if (other.name == info.name) return bad(at, absl::StrCat("stream name '", info.name, "' appears twice"));
    }
    file.streams.push_back(std::move(info));
  }
  if (num_chunks > r.left() / 16) return bad(r.pos(), absl::StrCat(num_chunks, " chunk entries cannot fit the header"));
  for (uint32_t c = 0; c < num_chunks; ++c) {
    CbfChunkInfo chunk;
    int64_t offset = 0;
    const uint64_t at = r.pos();
    r.Read(&offset);
    r.Read(&chunk.num_sequences);
    r.Read(&chunk.num_samples);
    const int64_t lowest = file.chunks.empty() ? 12 : static_cast<int64_t>(file.chunks.back().offset);
    if (offset < lowest || static_cast<uint64_t>(offset) > file.header_offset ||
        (file.chunks.empty() && offset != 12)) {
      return bad(at, absl::StrCat("chunk ", c, " starts at byte ", offset, ", outside [", lowest, ", ",
                                  file.header_offset, "] (chunks follow each other from byte 12 to the header)"));
    }
    chunk.offset = static_cast<uint64_t>(offset);
    file.chunks.push_back(chunk);
  }
  // Chunks are back to back: each ends where the next begins, the last where the header does.
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    file.chunks[c].end = c + 1 < file.chunks.size() ? file.chunks[c + 1].offset : file.header_offset;
  }
  return file;
}

absl::Status DecodeCntkLayoutChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index,
                                   uint64_t chunk_id, const std::vector<int>& source, Precision precision,
                                   const std::string& path, ParsedChunk* out) {
  return precision == Precision::kFloat ? DecodeChunk<float>(bytes, base, file, index, chunk_id, source, path, out)
                                        : DecodeChunk<double>(bytes, base, file, index, chunk_id, source, path, out);
}

absl::Status CountCntkLayoutChunk(std::string_view bytes, const CbfFile& file, uint64_t chunk_id,
                                  const std::vector<int>& source, Precision precision,
                                  const std::string& path, std::vector<uint32_t>* counts) {
  std::vector<uint32_t> lengths;
  return precision == Precision::kFloat
             ? CheckedWalk<float>(bytes, 0, file, chunk_id, source, path, counts, &lengths)
             : CheckedWalk<double>(bytes, 0, file, chunk_id, source, path, counts, &lengths);
}

}  // namespace conveyor::cbf
