// cbf_documented_layout.cc: layout 2 of cbf_reader.h, the one CNTK's documentation
// describes (version first, header, offsets table, data). Its chunks store no lengths: every
// chunk is walked whole when indexed, and again when decoded (or listed as a composite's
// member).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/status_macros.h"

namespace conveyor::cbf {

// The documentation's layout: header, offsets table, data (cbf_reader.h, layout 2).
absl::StatusOr<CbfFile> ReadDocumentedLayout(std::string_view bytes, const std::string& path) {
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

namespace {

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

}  // namespace

// Locates every input's section of chunk `c` and checks it whole: sizes within the chunk,
// column starts from 0 to nnz without going back, row codes not negative (and sample 0 for
// an input that is not a sequence), the sequences' lengths adding up to the table's
// numSamples. `lengths`: per sequence, the longest of its inputs.
absl::Status WalkDocumentedChunk(std::string_view bytes, uint64_t base, const CbfFile& file, uint64_t c,
                                 const std::string& path, std::vector<DocumentedInput>* inputs,
                                 std::vector<uint32_t>* lengths) {
  const CbfChunkInfo& chunk = file.chunks[c];
  Reader r(bytes, chunk.offset, chunk.end, base);
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

namespace {

// A kDocumented chunk: dense inputs one sample a sequence, used where they lie; sparse
// entries split into their samples by row code (row / dim), kept in file order within a
// sample. Where all of a sparse input's entries in the chunk are in sample 0 (always, for
// an input that is not a sequence), each row code is its index and a sequence's entries
// lie back to back in sample order: they are used where they lie, as in ctf2bin's layout.
// Otherwise they are sorted by sample into the chunk's columns.
template <typename T>
absl::Status DecodeDocumentedChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index,
                                   uint64_t chunk_id, const std::vector<int>& source, const std::string& path,
                                   ParsedChunk* out) {
  std::vector<DocumentedInput> inputs;
  std::vector<uint32_t> lengths;
  RETURN_IF_ERROR(WalkDocumentedChunk(bytes, base, file, chunk_id, path, &inputs, &lengths));
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
    // Row codes are not negative (the walk checked them): below dim, each is sample 0's index.
    if (!info.is_sequence || IndicesBelow(in.rows, in.nnz, info.dim)) {
      ps.sparse_values_in_place.resize(n_seq);
      ps.sparse_indices_in_place.resize(n_seq);
      ps.sequence_begin.resize(uint64_t{n_seq} + 1);
      ps.nnz_begin.reserve(uint64_t{n_seq} + 1);
      for (uint32_t j = 0; j < n_seq; ++j) {
        const uint32_t n = in.samples[j];  // 1, or 0 for a sequence input without entries
        const uint64_t kb = static_cast<uint32_t>(LoadI32(in.starts, j));
        ps.sparse_values_in_place[j] = reinterpret_cast<const std::byte*>(in.values + kb * sizeof(T));
        ps.sparse_indices_in_place[j] = reinterpret_cast<const std::byte*>(in.rows + kb * 4);
        if (n == 1) ps.nnz_begin.push_back(static_cast<uint32_t>(LoadI32(in.starts, j + 1)));
        ps.sequence_begin[j + 1] = ps.sequence_begin[j] + n;
        counts[i * n_seq + j] = n;
      }
      continue;
    }
    for (uint32_t j = 0; j < n_seq; ++j) {
      const uint32_t n = in.samples[j];
      const uint32_t kb = static_cast<uint32_t>(LoadI32(in.starts, j)), ke = static_cast<uint32_t>(LoadI32(in.starts, j + 1));
      // Entries by sample, file order within one: a counting sort (rows were checked by the walk).
      per_sample.assign(uint64_t{n} + 1, 0);
      for (uint32_t k = kb; k < ke; ++k) ++per_sample[static_cast<uint32_t>(LoadI32(in.rows, k)) / info.dim + 1];
      const uint64_t before = ps.nnz_begin.back();
      for (uint32_t t = 0; t < n; ++t) {
        per_sample[t + 1] += per_sample[t];
        ps.nnz_begin.push_back(before + per_sample[t + 1]);
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

absl::Status DecodeDocumentedLayoutChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index,
                                         uint64_t chunk_id, const std::vector<int>& source, Precision precision,
                                         const std::string& path, ParsedChunk* out) {
  return precision == Precision::kFloat
             ? DecodeDocumentedChunk<float>(bytes, base, file, index, chunk_id, source, path, out)
             : DecodeDocumentedChunk<double>(bytes, base, file, index, chunk_id, source, path, out);
}

absl::Status CountDocumentedLayoutChunk(std::string_view bytes, const CbfFile& file,
                                        uint64_t chunk_id, const std::vector<int>& source,
                                        const std::string& path, std::vector<uint32_t>* counts) {
  std::vector<DocumentedInput> inputs;
  std::vector<uint32_t> lengths;
  RETURN_IF_ERROR(WalkDocumentedChunk(bytes, 0, file, chunk_id, path, &inputs, &lengths));
  const size_t n_seq = lengths.size();
  counts->assign(source.size() * n_seq, 0);
  for (size_t i = 0; i < source.size(); ++i) {
    std::copy(inputs[source[i]].samples.begin(), inputs[source[i]].samples.end(),
              counts->begin() + i * n_seq);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::cbf
