#include "common/formats/cbf/cbf_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

// A bounds-checked little-endian reader over [pos, end) of the file.
class Reader {
 public:
  Reader(std::string_view bytes, uint64_t pos, uint64_t end) : bytes_(bytes), pos_(pos), end_(end) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return end_ - pos_; }
  template <typename T>
  bool Read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // `count` items of `size` bytes: a view of them, or false if they do not fit.
  bool Take(uint64_t count, uint64_t size, const char** out) {
    if (size != 0 && count > left() / size) return false;
    *out = bytes_.data() + pos_;
    pos_ += count * size;
    return true;
  }

 private:
  std::string_view bytes_;
  uint64_t pos_, end_;
};

}  // namespace

bool IsCbf(std::string_view bytes) {
  uint64_t magic = 0;
  if (bytes.size() < 8) return false;
  std::memcpy(&magic, bytes.data(), 8);
  return magic == kCbfMagic;
}

absl::StatusOr<CbfFile> ReadCbfFile(std::string_view bytes, const std::string& path) {
  auto bad = [&](uint64_t at, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": byte ", at, ": ", what, " (not a valid CNTK binary file)"));
  };
  const uint64_t size = bytes.size();
  Reader head(bytes, 0, size);
  uint64_t magic = 0;
  uint32_t version = 0;
  if (!head.Read(&magic) || magic != kCbfMagic) return bad(0, "expected the magic number \"cntk_bin\"");
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

absl::StatusOr<Index> BuildCbfIndex(const CbfFile& file, std::string_view bytes, const std::string& path) {
  Index index;
  index.keys_are_line_numbers = false;
  index.file_size = bytes.size();
  uint64_t key = 0;
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    const CbfChunkInfo& chunk = file.chunks[c];
    Reader r(bytes, chunk.offset, chunk.end);
    const char* lengths = nullptr;
    if (!r.Take(chunk.num_sequences, 4, &lengths)) {
      return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", chunk.offset, ": ", chunk.num_sequences,
                                              " sequence lengths do not fit the chunk's ", chunk.end - chunk.offset, " bytes"));
    }
    ChunkEntry ce;
    ce.first_sequence = index.sequences.size();
    ce.num_sequences = chunk.num_sequences;
    ce.begin_offset = chunk.offset;
    ce.end_offset = chunk.end;
    for (uint32_t j = 0; j < chunk.num_sequences; ++j) {
      SequenceEntry e;
      e.key = key++;
      e.offset = chunk.offset;
      e.line = j;
      std::memcpy(&e.num_samples, lengths + 4 * j, 4);
      ce.num_samples += e.num_samples;
      index.sequences.push_back(e);
    }
    if (ce.num_samples != chunk.num_samples) {
      return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", chunk.offset, ": its sequences hold ",
                                              ce.num_samples, " samples, the chunk table says ", chunk.num_samples));
    }
    index.total_samples += ce.num_samples;
    index.chunks.push_back(ce);
  }
  index.ComputeContentHash();
  return index;
}

namespace {

// Appends `count` items of `bytes` to `v` (nothing at all for none: memcpy must not see the
// null data() of an empty vector).
template <typename T>
void Append(std::vector<T>* v, const char* bytes, uint64_t count) {
  if (count == 0) return;
  const size_t at = v->size();
  v->resize(at + count);
  std::memcpy(v->data() + at, bytes, count * sizeof(T));
}

template <typename T>
absl::Status DecodeChunk(std::string_view bytes, const CbfFile& file, const Index& index, uint64_t chunk_id,
                         const std::vector<int>& source, const std::string& path, ParsedChunk* out) {
  const CbfChunkInfo& chunk = file.chunks[chunk_id];
  const ChunkEntry& ce = index.chunks[chunk_id];
  Reader r(bytes, chunk.offset, chunk.end);
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", chunk_id, ", byte ", r.pos(), ": ", what));
  };
  const uint32_t n_seq = chunk.num_sequences;
  const char* lengths_raw = nullptr;
  if (!r.Take(n_seq, 4, &lengths_raw)) return bad("the sequence lengths run past the chunk");
  std::vector<uint32_t> lengths(n_seq);
  if (n_seq) std::memcpy(lengths.data(), lengths_raw, 4 * uint64_t{n_seq});
  // Which output stream each file stream feeds (-1: skipped).
  std::vector<int> target(file.streams.size(), -1);
  for (size_t i = 0; i < source.size(); ++i) target[source[i]] = static_cast<int>(i);
  out->streams.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    out->streams[i].format = file.streams[source[i]].format;
    out->streams[i].dim = file.streams[source[i]].dim;
  }
  // Samples per (stream, sequence), to drop sequences with none at all.
  std::vector<uint32_t> counts(source.size() * n_seq, 0);
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    ParsedStream* ps = target[s] >= 0 ? &out->streams[target[s]] : nullptr;
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
        if (ps != nullptr) Append(&ps->values<T>(), values, uint64_t{n} * info.dim);
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
          Append(&ps->values<T>(), values, static_cast<uint64_t>(nnz));
          Append(&ps->indices, indices, static_cast<uint64_t>(nnz));
          uint64_t running = ps->nnz_begin.back();
          for (uint32_t t = 0; t < n; ++t) {
            int32_t k = 0;
            std::memcpy(&k, per_sample + 4 * t, 4);
            running += static_cast<uint64_t>(k);
            ps->nnz_begin.push_back(running);
          }
        }
      }
      if (ps != nullptr) {
        ps->sequence_begin.push_back(ps->sequence_begin.back() + n);
        counts[static_cast<size_t>(target[s]) * n_seq + j] = n;
      }
    }
  }
  // Sequences with no sample in any delivered stream are not delivered (DESIGN.md section 4):
  // they keep no slot. The others keep their data in file order.
  out->slot_of.assign(n_seq, -1);
  bool all_kept = true;
  for (uint32_t j = 0; j < n_seq; ++j) {
    uint32_t most = 0;
    for (size_t i = 0; i < source.size(); ++i) most = std::max(most, counts[i * n_seq + j]);
    if (most == 0) {
      all_kept = false;
      continue;
    }
    out->slot_of[j] = static_cast<int32_t>(out->keys.size());
    out->keys.push_back(index.sequences[ce.first_sequence + j].key);
    out->lengths.push_back(lengths[j]);
  }
  if (!all_kept) {
    // Rebuild the columns without the empty sequences (their ranges are empty: only the
    // sequence_begin entries go).
    for (auto& ps : out->streams) {
      std::vector<uint64_t> begins{0};
      for (uint32_t j = 0; j < n_seq; ++j) {
        if (out->slot_of[j] >= 0) begins.push_back(ps.sequence_begin[j + 1]);
      }
      ps.sequence_begin = std::move(begins);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path) {
  if (chunk_id >= file.chunks.size() || chunk_id >= index.chunks.size()) return absl::InternalError("no such chunk");
  auto out = std::make_unique<ParsedChunk>();
  out->chunk_id = chunk_id;
  out->precision = precision;
  absl::Status st = precision == Precision::kFloat
                        ? DecodeChunk<float>(bytes, file, index, chunk_id, source, path, out.get())
                        : DecodeChunk<double>(bytes, file, index, chunk_id, source, path, out.get());
  if (!st.ok()) return st;
  return out;
}

}  // namespace conveyor
