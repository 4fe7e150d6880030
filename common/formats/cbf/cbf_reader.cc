// cbf_reader.cc: the entry points of cbf_reader.h: telling the layouts apart, the index of
// either, and what their decoders share. Each layout's own reading is in its file
// (cbf_cntk_layout.cc, cbf_documented_layout.cc).
#include "common/formats/cbf/cbf_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/status_macros.h"

namespace conveyor {

using cbf::BadHeader;
using cbf::DecodeCntkLayoutChunk;
using cbf::DecodeDocumentedLayoutChunk;
using cbf::ReadCntkLayout;
using cbf::ReadDocumentedLayout;
using cbf::Reader;

bool IsCbf(std::string_view bytes) {
  uint64_t first = 0;
  if (bytes.size() < 8) return false;
  std::memcpy(&first, bytes.data(), 8);
  return first == kCbfMagic || first == kCbfDocumentedVersion;
}

absl::StatusOr<CbfFile> ReadCbfFile(std::string_view bytes, const std::string& path) {
  auto bad = BadHeader(path);
  const uint64_t size = bytes.size();
  Reader head(bytes, 0, size);
  uint64_t magic = 0;
  if (!head.Read(&magic)) return bad(0, "expected the magic number \"cntk_bin\" or the version 1 as an int64");
  if (magic == kCbfDocumentedVersion) return ReadDocumentedLayout(bytes, path);
  if (magic != kCbfMagic) return bad(0, "expected the magic number \"cntk_bin\" or the version 1 as an int64");
  return ReadCntkLayout(bytes, path);
}

absl::StatusOr<Index> BuildCbfIndex(const CbfFile& file, std::string_view bytes, const std::string& path) {
  Index index;
  index.keys_are_line_numbers = false;
  index.file_size = bytes.size();
  uint64_t key = 0;
  std::vector<cbf::DocumentedInput> inputs;
  std::vector<uint32_t> documented_lengths;
  // Room for every sequence the chunk table states, made once (each needs at least 4 bytes
  // of its chunk, checked below: a table claiming more than the file holds reserves no more).
  uint64_t stated = 0;
  for (const CbfChunkInfo& chunk : file.chunks) stated += chunk.num_sequences;
  index.sequences.reserve(std::min<uint64_t>(stated, bytes.size() / 4));
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    const CbfChunkInfo& chunk = file.chunks[c];
    Reader r(bytes, chunk.offset, chunk.end);
    const char* lengths = nullptr;
    if (file.layout == CbfLayout::kDocumented) {
      RETURN_IF_ERROR(cbf::WalkDocumentedChunk(bytes, 0, file, c, path, &inputs, &documented_lengths));
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

absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path) {
  return ParseCbfChunk(bytes, 0, file, index, chunk_id, source, precision, path);
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, uint64_t base, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path) {
  if (chunk_id >= file.chunks.size() || chunk_id >= index.chunks.size()) return absl::InternalError("no such chunk");
  const CbfChunkInfo& chunk = file.chunks[chunk_id];
  if (chunk.offset < base || chunk.end < chunk.offset || chunk.end - base > bytes.size()) {
    return absl::InternalError(absl::StrCat(path, ": chunk ", chunk_id, " (bytes ", chunk.offset, "-", chunk.end,
                                            ") is not within the ", bytes.size(), " bytes given from byte ", base));
  }
  auto out = std::make_unique<ParsedChunk>();
  out->chunk_id = chunk_id;
  out->precision = precision;
  const bool documented = file.layout == CbfLayout::kDocumented;
  absl::Status st =
      documented ? DecodeDocumentedLayoutChunk(bytes, base, file, index, chunk_id, source, precision, path, out.get())
                 : DecodeCntkLayoutChunk(bytes, base, file, index, chunk_id, source, precision, path, out.get());
  if (!st.ok()) return st;
  return out;
}

absl::Status CountCbfChunk(std::string_view bytes, const CbfFile& file, const Index& index,
                           uint64_t chunk_id, const std::vector<int>& source, Precision precision,
                           const std::string& path, CbfChunkCounts* out) {
  if (chunk_id >= file.chunks.size() || chunk_id >= index.chunks.size()) {
    return absl::InternalError("no such chunk");
  }
  std::vector<uint32_t> counts;
  RETURN_IF_ERROR(
      file.layout == CbfLayout::kDocumented
          ? cbf::CountDocumentedLayoutChunk(bytes, file, chunk_id, source, path, &counts)
          : cbf::CountCntkLayoutChunk(bytes, file, chunk_id, source, precision, path, &counts));
  const uint32_t n_seq = file.chunks[chunk_id].num_sequences;
  out->slot_of = cbf::DeliveredSlots(counts, n_seq);
  out->samples.clear();
  for (uint32_t j = 0; j < n_seq; ++j) {
    if (out->slot_of[j] < 0) continue;
    for (size_t i = 0; i < source.size(); ++i) out->samples.push_back(counts[i * n_seq + j]);
  }
  return absl::OkStatus();
}

namespace cbf {

// Sequences with no sample in any delivered stream are not delivered (docs/design.md
// section 5) and keep no slot; the others are numbered in file order.
HugeVector<int32_t> DeliveredSlots(const std::vector<uint32_t>& counts, uint32_t n_seq) {
  const size_t n_streams = n_seq ? counts.size() / n_seq : 0;
  // Per sequence, nonzero when any stream has a sample: OR over the streams' rows.
  HugeVector<int32_t> slot_of(n_seq, 0);
  for (size_t i = 0; i < n_streams; ++i) {
    const uint32_t* row = counts.data() + i * n_seq;
    for (uint32_t j = 0; j < n_seq; ++j) slot_of[j] |= static_cast<int32_t>(row[j] != 0);
  }
  int32_t next = 0;
  for (uint32_t j = 0; j < n_seq; ++j) {
    const int32_t kept = slot_of[j];
    slot_of[j] = kept ? next : -1;
    next += kept;
  }
  return slot_of;
}

// The chunk's slots, keys and lengths from its sequences' sample `counts` per delivered
// stream (stream-major), in file order.
void FinishChunk(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& lengths, const Index& index,
                 const ChunkEntry& ce, ParsedChunk* out) {
  const uint32_t n_seq = static_cast<uint32_t>(lengths.size());
  out->slot_of = DeliveredSlots(counts, n_seq);
  out->keys.resize(n_seq);
  out->lengths.resize(n_seq);
  const SequenceEntry* entries = index.sequences.data() + ce.first_sequence;
  uint32_t kept = 0;
  for (uint32_t j = 0; j < n_seq; ++j) {  // written at `kept` always, kept only when delivered
    out->keys[kept] = entries[j].key;
    out->lengths[kept] = lengths[j];
    kept += out->slot_of[j] >= 0;
  }
  out->keys.resize(kept);
  out->lengths.resize(kept);
  const bool all_kept = kept == n_seq;
  if (!all_kept) {
    // Rebuild the columns without the empty sequences (their ranges are empty: only the
    // sequence_begin entries go).
    for (auto& ps : out->streams) {
      HugeVector<uint64_t> begins{0};
      HugeVector<const std::byte*> in_place, sparse_values, sparse_indices;
      for (uint32_t j = 0; j < n_seq; ++j) {
        if (out->slot_of[j] < 0) continue;
        begins.push_back(ps.sequence_begin[j + 1]);
        if (!ps.in_place.empty()) in_place.push_back(ps.in_place[j]);
        if (!ps.sparse_values_in_place.empty()) {
          sparse_values.push_back(ps.sparse_values_in_place[j]);
          sparse_indices.push_back(ps.sparse_indices_in_place[j]);
        }
      }
      ps.sequence_begin = std::move(begins);
      ps.in_place = std::move(in_place);
      ps.sparse_values_in_place = std::move(sparse_values);
      ps.sparse_indices_in_place = std::move(sparse_indices);
    }
  }
}

}  // namespace cbf
}  // namespace conveyor
