// cbf_cntk_layout.cc: layout 1 of cbf_reader.h, the one CNTK's ctf2bin.py writes (magic
// "cntk_bin", chunks, then the header at the offset the file's last 8 bytes give).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/status_macros.h"

namespace conveyor::cbf {
namespace {

// Walks chunk `chunk_id` and checks all of it: `lengths` and `counts` (per delivered stream,
// per sequence) always, the streams' columns into `out` where it is given. Without `out` no
// value is read (a sparse sequence's indices and per-sample counts still are, to check them),
// and the walk fails exactly where and as the decode does: one loop serves both.
template <typename T>
absl::Status WalkChunk(std::string_view bytes, const CbfFile& file, uint64_t chunk_id,
                       const std::vector<int>& source, const std::string& path, ParsedChunk* out,
                       std::vector<uint32_t>* counts_out, std::vector<uint32_t>* lengths_out) {
  const CbfChunkInfo& chunk = file.chunks[chunk_id];
  Reader r(bytes, chunk.offset, chunk.end);
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
  if (out != nullptr) out->streams.resize(source.size());
  for (size_t i = 0; out != nullptr && i < source.size(); ++i) {
    ParsedStream& ps = out->streams[i];
    ps.format = file.streams[source[i]].format;
    ps.dim = file.streams[source[i]].dim;
    ps.sequence_begin.reserve(uint64_t{n_seq} + 1);
    if (ps.format == StreamFormat::kDense) ps.in_place.reserve(n_seq);
    if (ps.format == StreamFormat::kSparse) {
      ps.sparse_values_in_place.reserve(n_seq);
      ps.sparse_indices_in_place.reserve(n_seq);
    }
  }
  // Samples per (stream, sequence), to drop sequences with none at all.
  std::vector<uint32_t>& counts = *counts_out;
  counts.assign(source.size() * n_seq, 0);
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    ParsedStream* ps = target[s] >= 0 && out != nullptr ? &out->streams[target[s]] : nullptr;
    if (ps != nullptr && info.format == StreamFormat::kSparse) {
      // Size the columns once: a quick walk of this stream's sequences (the decode below
      // checks everything and reports any damage; the walk just stops at it). The entries
      // themselves are used where they lie: only their per-sample ranges are columns.
      Reader walk = r;
      uint64_t samples = 0;
      const char* skipped = nullptr;
      for (uint32_t j = 0; j < n_seq; ++j) {
        uint32_t n = 0;
        int32_t nnz = 0;
        if (!walk.Read(&n) || !walk.Read(&nnz) || nnz < 0 ||
            !walk.Take(static_cast<uint64_t>(nnz), sizeof(T) + 4, &skipped) || !walk.Take(n, 4, &skipped)) {
          break;
        }
        samples += n;
      }
      ps->nnz_begin.reserve(ps->nnz_begin.size() + samples);
    }
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
        if (ps != nullptr) ps->in_place.push_back(reinterpret_cast<const std::byte*>(values));  // used where it lies
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
        if (ps != nullptr) {
          ps->sparse_values_in_place.push_back(reinterpret_cast<const std::byte*>(values));  // used where they lie
          ps->sparse_indices_in_place.push_back(reinterpret_cast<const std::byte*>(indices));
          uint64_t running = ps->nnz_begin.back();
          for (uint32_t t = 0; t < n; ++t) {
            int32_t k = 0;
            std::memcpy(&k, per_sample + 4 * t, 4);
            running += static_cast<uint64_t>(k);
            ps->nnz_begin.push_back(running);
          }
        }
      }
      if (ps != nullptr) ps->sequence_begin.push_back(ps->sequence_begin.back() + n);
      if (target[s] >= 0) counts[static_cast<size_t>(target[s]) * n_seq + j] = n;
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status DecodeChunk(std::string_view bytes, const CbfFile& file, const Index& index,
                         uint64_t chunk_id, const std::vector<int>& source, const std::string& path,
                         ParsedChunk* out) {
  std::vector<uint32_t> counts, lengths;
  RETURN_IF_ERROR(WalkChunk<T>(bytes, file, chunk_id, source, path, out, &counts, &lengths));
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

absl::Status DecodeCntkLayoutChunk(std::string_view bytes, const CbfFile& file, const Index& index, uint64_t chunk_id,
                                   const std::vector<int>& source, Precision precision, const std::string& path,
                                   ParsedChunk* out) {
  return precision == Precision::kFloat ? DecodeChunk<float>(bytes, file, index, chunk_id, source, path, out)
                                        : DecodeChunk<double>(bytes, file, index, chunk_id, source, path, out);
}

absl::Status CountCntkLayoutChunk(std::string_view bytes, const CbfFile& file, uint64_t chunk_id,
                                  const std::vector<int>& source, Precision precision,
                                  const std::string& path, std::vector<uint32_t>* counts) {
  std::vector<uint32_t> lengths;
  return precision == Precision::kFloat
             ? WalkChunk<float>(bytes, file, chunk_id, source, path, nullptr, counts, &lengths)
             : WalkChunk<double>(bytes, file, chunk_id, source, path, nullptr, counts, &lengths);
}

}  // namespace conveyor::cbf
