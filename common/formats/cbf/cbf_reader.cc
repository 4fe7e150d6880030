#include "common/formats/cbf/cbf_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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
    uint64_t n = 0;
    if (__builtin_mul_overflow(count, size, &n) || n > left()) return false;
    *out = bytes_.data() + pos_;
    pos_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  uint64_t pos_, end_;
};

}  // namespace

bool IsCbf(std::string_view bytes) {
  uint64_t first = 0;
  if (bytes.size() < 8) return false;
  std::memcpy(&first, bytes.data(), 8);
  return first == kCbfMagic || first == kCbfDocumentedVersion;
}

namespace {

auto BadHeader(const std::string& path) {
  return [&path](uint64_t at, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": byte ", at, ": ", what, " (not a valid CNTK binary file)"));
  };
}

// The documentation's layout: header, offsets table, data (cbf_reader.h, layout 2).
absl::StatusOr<CbfFile> ReadDocumentedFile(std::string_view bytes, const std::string& path) {
  auto bad = BadHeader(path);
  const uint64_t size = bytes.size();
  Reader r(bytes, 8, size);
  int64_t num_chunks = 0;
  int32_t num_inputs = 0;
  if (!r.Read(&num_chunks) || !r.Read(&num_inputs)) return bad(8, "the header ends before its chunk and input counts");
  if (num_inputs <= 0) return bad(16, absl::StrCat("the file declares ", num_inputs, " inputs"));
  if (static_cast<uint64_t>(num_inputs) > r.left() / 16) {
    return bad(16, absl::StrCat(num_inputs, " input headers cannot fit the file"));
  }
  CbfFile file;
  file.layout = CbfLayout::kDocumented;
  for (int32_t s = 0; s < num_inputs; ++s) {
    CbfStreamInfo info;
    const uint64_t at = r.pos();
    int32_t name_len = 0, deserializer = 0, storage = 0, elem_type = 0, is_sequence = 0, sample_size = 0;
    const char* name = nullptr;
    if (!r.Read(&name_len) || name_len <= 0 || !r.Take(static_cast<uint64_t>(name_len), 1, &name) ||
        !r.Read(&deserializer)) {
      return bad(at, absl::StrCat("input ", s, "'s name (length ", name_len, ") runs past the file or is empty"));
    }
    if (deserializer != 0 && deserializer != 1) {
      return bad(at, absl::StrCat("input ", s, " names deserializer ", deserializer,
                                  " (expected 0 DenseBinaryDataDeserializer or 1 SparseBinaryDataDeserializer)"));
    }
    const bool sparse = deserializer == 1;
    if ((sparse && (!r.Read(&storage) || !r.Read(&elem_type) || !r.Read(&is_sequence))) ||
        (!sparse && !r.Read(&elem_type)) || !r.Read(&sample_size)) {
      return bad(at, absl::StrCat("input ", s, "'s deserializer header runs past the file"));
    }
    if (storage != 0) return bad(at, absl::StrCat("input ", s, " has storage type ", storage, " (only 0, sparse CSC, is defined)"));
    if (elem_type != 0 && elem_type != 1) {
      return bad(at, absl::StrCat("input ", s, " has element type ", elem_type, " (expected 0 float or 1 double)"));
    }
    if (is_sequence != 0 && is_sequence != 1) {
      return bad(at, absl::StrCat("input ", s, " has isSequence ", is_sequence, " (expected 0 or 1)"));
    }
    if (sample_size <= 0) return bad(at, absl::StrCat("input ", s, " has sample size ", sample_size));
    info.name.assign(name, static_cast<size_t>(name_len));
    info.format = sparse ? StreamFormat::kSparse : StreamFormat::kDense;
    info.precision = elem_type == 0 ? Precision::kFloat : Precision::kDouble;
    info.dim = static_cast<uint32_t>(sample_size);
    info.is_sequence = sparse && is_sequence == 1;
    for (const auto& other : file.streams) {
      if (other.name == info.name) return bad(at, absl::StrCat("input name '", info.name, "' appears twice"));
    }
    file.streams.push_back(std::move(info));
  }
  if (num_chunks < 0 || static_cast<uint64_t>(num_chunks) > r.left() / 16) {
    return bad(8, absl::StrCat(num_chunks, " offsets table rows cannot fit the file"));
  }
  file.header_offset = r.pos() + 16 * static_cast<uint64_t>(num_chunks);  // the data section
  for (int64_t c = 0; c < num_chunks; ++c) {
    const uint64_t at = r.pos();
    int64_t offset = 0;
    int32_t sequences = 0, samples = 0;
    r.Read(&offset);
    r.Read(&sequences);
    r.Read(&samples);
    const uint64_t lowest = file.chunks.empty() ? 0 : file.chunks.back().offset - file.header_offset;
    if (offset < 0 || static_cast<uint64_t>(offset) < lowest || static_cast<uint64_t>(offset) > size - file.header_offset ||
        (file.chunks.empty() && offset != 0)) {
      return bad(at, absl::StrCat("chunk ", c, " starts at data byte ", offset, ", outside [", lowest, ", ",
                                  size - file.header_offset, "] (chunks follow each other from data byte 0)"));
    }
    if (sequences < 0 || samples < 0) {
      return bad(at, absl::StrCat("chunk ", c, " has ", sequences, " sequences and ", samples, " samples"));
    }
    CbfChunkInfo chunk;
    chunk.offset = file.header_offset + static_cast<uint64_t>(offset);
    chunk.num_sequences = static_cast<uint32_t>(sequences);
    chunk.num_samples = static_cast<uint32_t>(samples);
    file.chunks.push_back(chunk);
  }
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    file.chunks[c].end = c + 1 < file.chunks.size() ? file.chunks[c + 1].offset : size;
  }
  return file;
}

}  // namespace

absl::StatusOr<CbfFile> ReadCbfFile(std::string_view bytes, const std::string& path) {
  auto bad = BadHeader(path);
  const uint64_t size = bytes.size();
  Reader head(bytes, 0, size);
  uint64_t magic = 0;
  uint32_t version = 0;
  if (!head.Read(&magic)) return bad(0, "expected the magic number \"cntk_bin\" or the version 1 as an int64");
  if (magic == kCbfDocumentedVersion) return ReadDocumentedFile(bytes, path);
  if (magic != kCbfMagic) return bad(0, "expected the magic number \"cntk_bin\" or the version 1 as an int64");
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

namespace {

// Samples are implied by row codes, not stored, so a few bytes could claim billions of them:
// bounds on what one sequence and one chunk may hold (a sequence of 2^20 frames is 3 hours
// of speech at 100 frames a second).
constexpr uint32_t kMaxDocumentedSequence = 1u << 20;
constexpr uint64_t kMaxDocumentedChunkSamples = 1u << 26;

// One input's section of a kDocumented chunk, located and checked.
struct DocumentedInput {
  const char* dense = nullptr;  // dense: numSequences * dim elements
  uint32_t nnz = 0;             // sparse: entries, rows (sample * dim + index), colStart[numSequences + 1]
  const char *values = nullptr, *rows = nullptr, *starts = nullptr;
  std::vector<uint32_t> samples;  // per sequence: its samples in this input
};

uint32_t ElemSize(const CbfStreamInfo& info) { return info.precision == Precision::kFloat ? 4 : 8; }

int32_t LoadI32(const char* p, uint64_t i) {
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// Samples of sequence j of a sparse input: one past its last sample number (1 for an input
// that is not a sequence; none for a sequence input without entries).
uint32_t SparseSamples(const CbfStreamInfo& info, const DocumentedInput& in, uint32_t j) {
  if (!info.is_sequence) return 1;
  uint32_t most = 0;
  for (int32_t k = LoadI32(in.starts, j); k < LoadI32(in.starts, j + 1); ++k) {
    most = std::max(most, static_cast<uint32_t>(LoadI32(in.rows, static_cast<uint64_t>(k))) / info.dim + 1);
  }
  return most;
}

// Locates every input's section of chunk `c` and checks it whole: sizes within the chunk,
// column starts from 0 to nnz without going back, row codes not negative (and sample 0 for
// an input that is not a sequence), the sequences' lengths adding up to the table's
// numSamples. `lengths`: per sequence, the longest of its inputs.
absl::Status WalkDocumentedChunk(std::string_view bytes, const CbfFile& file, uint64_t c, const std::string& path,
                                 std::vector<DocumentedInput>* inputs, std::vector<uint32_t>* lengths) {
  const CbfChunkInfo& chunk = file.chunks[c];
  Reader r(bytes, chunk.offset, chunk.end);
  auto bad = [&](const CbfStreamInfo& info, uint64_t at, const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", at, ": input '", info.name, "': ", what));
  };
  const uint32_t n_seq = chunk.num_sequences;
  // Every input spends at least 4 bytes a sequence (a sample of dim >= 1, or a column start):
  // checked before anything is sized by the count.
  if (n_seq > (chunk.end - chunk.offset) / 4) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", chunk.offset, ": ", n_seq,
                                            " sequences cannot fit the chunk's ", chunk.end - chunk.offset, " bytes"));
  }
  inputs->assign(file.streams.size(), {});
  lengths->assign(n_seq, 0);
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    DocumentedInput& in = (*inputs)[s];
    const uint64_t at = r.pos();
    if (info.format == StreamFormat::kDense) {
      if (!r.Take(uint64_t{n_seq} * info.dim, ElemSize(info), &in.dense)) {
        return bad(info, at, absl::StrCat(n_seq, " samples of dimension ", info.dim, " run past the chunk's end at byte ",
                                          chunk.end));
      }
      in.samples.assign(n_seq, 1);
      for (uint32_t& len : *lengths) len = std::max(len, 1u);
      continue;
    }
    int32_t nnz = 0;
    if (!r.Read(&nnz) || nnz < 0) return bad(info, at, "expected a non-negative nnz");
    in.nnz = static_cast<uint32_t>(nnz);
    if (!r.Take(in.nnz, ElemSize(info), &in.values) || !r.Take(in.nnz, 4, &in.rows) ||
        !r.Take(uint64_t{n_seq} + 1, 4, &in.starts)) {
      return bad(info, at, absl::StrCat(nnz, " entries and ", n_seq + 1, " column starts run past the chunk's end at byte ",
                                        chunk.end));
    }
    const uint64_t starts_at = r.pos() - 4 * (uint64_t{n_seq} + 1);
    if (LoadI32(in.starts, 0) != 0 || LoadI32(in.starts, n_seq) != nnz) {
      return bad(info, starts_at, absl::StrCat("column starts run from ", LoadI32(in.starts, 0), " to ",
                                               LoadI32(in.starts, n_seq), ", expected 0 to nnz ", nnz));
    }
    for (uint32_t j = 0; j < n_seq; ++j) {
      if (LoadI32(in.starts, j + 1) < LoadI32(in.starts, j)) {
        return bad(info, starts_at + 4 * (j + 1), absl::StrCat("sequence ", j, "'s column start goes back"));
      }
    }
    const uint64_t rows_at = starts_at - 4 * uint64_t{in.nnz};
    for (uint32_t k = 0; k < in.nnz; ++k) {
      const int32_t row = LoadI32(in.rows, k);
      if (row < 0 || (!info.is_sequence && static_cast<uint32_t>(row) >= info.dim)) {
        return bad(info, rows_at + 4 * uint64_t{k},
                   absl::StrCat("row code ", row, " is outside [0, ", info.is_sequence ? "2^31" : std::to_string(info.dim),
                                info.is_sequence ? ")" : ") (the input is not a sequence: every entry is in sample 0)"));
      }
    }
    in.samples.resize(n_seq);
    for (uint32_t j = 0; j < n_seq; ++j) {
      const uint32_t n = in.samples[j] = SparseSamples(info, in, j);
      if (n > kMaxDocumentedSequence) {
        return bad(info, rows_at, absl::StrCat("sequence ", j, " reaches sample ", n - 1, " (at most ",
                                               kMaxDocumentedSequence, " samples a sequence are accepted)"));
      }
      (*lengths)[j] = std::max((*lengths)[j], n);
    }
  }
  uint64_t total = 0;
  for (uint32_t len : *lengths) total += len;
  if (total > kMaxDocumentedChunkSamples) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", chunk.offset, ": its sequences hold ", total,
                                            " samples (at most ", kMaxDocumentedChunkSamples, " a chunk are accepted)"));
  }
  if (total != chunk.num_samples) {
    return absl::DataLossError(absl::StrCat(path, ": chunk ", c, ", byte ", chunk.offset, ": its sequences hold ", total,
                                            " samples, the offsets table says ", chunk.num_samples));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Index> BuildCbfIndex(const CbfFile& file, std::string_view bytes, const std::string& path) {
  Index index;
  index.keys_are_line_numbers = false;
  index.file_size = bytes.size();
  uint64_t key = 0;
  std::vector<DocumentedInput> inputs;
  std::vector<uint32_t> documented_lengths;
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    const CbfChunkInfo& chunk = file.chunks[c];
    Reader r(bytes, chunk.offset, chunk.end);
    const char* lengths = nullptr;
    if (file.layout == CbfLayout::kDocumented) {
      RETURN_IF_ERROR(WalkDocumentedChunk(bytes, file, c, path, &inputs, &documented_lengths));
      lengths = reinterpret_cast<const char*>(documented_lengths.data());
    } else if (!r.Take(chunk.num_sequences, 4, &lengths)) {
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

void FinishChunk(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& lengths, const Index& index,
                 const ChunkEntry& ce, ParsedChunk* out);

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
    ParsedStream& ps = out->streams[i];
    ps.format = file.streams[source[i]].format;
    ps.dim = file.streams[source[i]].dim;
    ps.sequence_begin.reserve(uint64_t{n_seq} + 1);
    if (ps.format == StreamFormat::kDense) ps.in_place.reserve(n_seq);
  }
  // Samples per (stream, sequence), to drop sequences with none at all.
  std::vector<uint32_t> counts(source.size() * n_seq, 0);
  for (size_t s = 0; s < file.streams.size(); ++s) {
    const CbfStreamInfo& info = file.streams[s];
    ParsedStream* ps = target[s] >= 0 ? &out->streams[target[s]] : nullptr;
    if (ps != nullptr && info.format == StreamFormat::kSparse) {
      // Size the columns once: a quick walk of this stream's sequences (the decode below
      // checks everything and reports any damage; the walk just stops at it).
      Reader walk = r;
      uint64_t samples = 0, entries = 0;
      const char* skipped = nullptr;
      for (uint32_t j = 0; j < n_seq; ++j) {
        uint32_t n = 0;
        int32_t nnz = 0;
        if (!walk.Read(&n) || !walk.Read(&nnz) || nnz < 0 ||
            !walk.Take(static_cast<uint64_t>(nnz), sizeof(T) + 4, &skipped) || !walk.Take(n, 4, &skipped)) {
          break;
        }
        samples += n;
        entries += static_cast<uint64_t>(nnz);
      }
      ps->nnz_begin.reserve(ps->nnz_begin.size() + samples);
      ps->indices.reserve(ps->indices.size() + entries);
      ps->values<T>().reserve(ps->values<T>().size() + entries);
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
  FinishChunk(counts, lengths, index, ce, out);
  return absl::OkStatus();
}

// The chunk's slots, keys and lengths from its sequences' sample `counts` per delivered
// stream (stream-major): sequences with no sample in any delivered stream are not delivered
// (docs/design.md section 5) and keep no slot; the others keep their data in file order.
void FinishChunk(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& lengths, const Index& index,
                 const ChunkEntry& ce, ParsedChunk* out) {
  const uint32_t n_seq = static_cast<uint32_t>(lengths.size());
  const size_t n_streams = out->streams.size();
  out->slot_of.assign(n_seq, -1);
  out->keys.reserve(n_seq);
  out->lengths.reserve(n_seq);
  bool all_kept = true;
  for (uint32_t j = 0; j < n_seq; ++j) {
    uint32_t most = 0;
    for (size_t i = 0; i < n_streams; ++i) most = std::max(most, counts[i * n_seq + j]);
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
      std::vector<const std::byte*> in_place;
      for (uint32_t j = 0; j < n_seq; ++j) {
        if (out->slot_of[j] < 0) continue;
        begins.push_back(ps.sequence_begin[j + 1]);
        if (!ps.in_place.empty()) in_place.push_back(ps.in_place[j]);
      }
      ps.sequence_begin = std::move(begins);
      ps.in_place = std::move(in_place);
    }
  }
}

// A kDocumented chunk: dense inputs one sample a sequence; sparse entries split into their
// samples by row code (row / dim), kept in file order within a sample.
template <typename T>
absl::Status DecodeDocumentedChunk(std::string_view bytes, const CbfFile& file, const Index& index, uint64_t chunk_id,
                                   const std::vector<int>& source, const std::string& path, ParsedChunk* out) {
  std::vector<DocumentedInput> inputs;
  std::vector<uint32_t> lengths;
  RETURN_IF_ERROR(WalkDocumentedChunk(bytes, file, chunk_id, path, &inputs, &lengths));
  const uint32_t n_seq = static_cast<uint32_t>(lengths.size());
  std::vector<uint32_t> counts(source.size() * n_seq, 0);
  out->streams.resize(source.size());
  std::vector<uint32_t> order, per_sample;
  for (size_t i = 0; i < source.size(); ++i) {
    const CbfStreamInfo& info = file.streams[source[i]];
    const DocumentedInput& in = inputs[source[i]];
    ParsedStream& ps = out->streams[i];
    ps.format = info.format;
    ps.dim = info.dim;
    if (info.format == StreamFormat::kDense) {
      for (uint32_t j = 0; j < n_seq; ++j) {  // used where it lies
        ps.in_place.push_back(reinterpret_cast<const std::byte*>(in.dense) + uint64_t{j} * info.dim * sizeof(T));
        ps.sequence_begin.push_back(j + 1);
        counts[i * n_seq + j] = 1;
      }
      continue;
    }
    for (uint32_t j = 0; j < n_seq; ++j) {
      const uint32_t n = in.samples[j];
      const uint32_t kb = static_cast<uint32_t>(LoadI32(in.starts, j)), ke = static_cast<uint32_t>(LoadI32(in.starts, j + 1));
      // Entries by sample, file order within one: a counting sort (rows were checked by the walk).
      per_sample.assign(uint64_t{n} + 1, 0);
      for (uint32_t k = kb; k < ke; ++k) ++per_sample[static_cast<uint32_t>(LoadI32(in.rows, k)) / info.dim + 1];
      const uint64_t base = ps.nnz_begin.back();
      for (uint32_t t = 0; t < n; ++t) {
        per_sample[t + 1] += per_sample[t];
        ps.nnz_begin.push_back(base + per_sample[t + 1]);
      }
      order.resize(ke - kb);
      for (uint32_t k = kb; k < ke; ++k) order[per_sample[static_cast<uint32_t>(LoadI32(in.rows, k)) / info.dim]++] = k;
      for (uint32_t k : order) {
        T v;
        std::memcpy(&v, in.values + sizeof(T) * k, sizeof(T));
        ps.values<T>().push_back(v);
        ps.indices.push_back(static_cast<int32_t>(static_cast<uint32_t>(LoadI32(in.rows, k)) % info.dim));
      }
      ps.sequence_begin.push_back(ps.sequence_begin.back() + n);
      counts[i * n_seq + j] = n;
    }
  }
  FinishChunk(counts, lengths, index, index.chunks[chunk_id], out);
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
  const bool documented = file.layout == CbfLayout::kDocumented;
  absl::Status st =
      precision == Precision::kFloat
          ? (documented ? DecodeDocumentedChunk<float>(bytes, file, index, chunk_id, source, path, out.get())
                        : DecodeChunk<float>(bytes, file, index, chunk_id, source, path, out.get()))
          : (documented ? DecodeDocumentedChunk<double>(bytes, file, index, chunk_id, source, path, out.get())
                        : DecodeChunk<double>(bytes, file, index, chunk_id, source, path, out.get()));
  if (!st.ok()) return st;
  return out;
}

}  // namespace conveyor
