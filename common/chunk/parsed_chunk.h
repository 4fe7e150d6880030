// parsed_chunk.h: a chunk after parsing, in columnar form: what every deserializer produces
// and every assembler consumes. Per stream, samples of all the chunk's good sequences are
// stored back to back (dense: `dim` values a sample; sparse: per-sample nnz ranges into
// `indices`/`values`, indices in file order). Sequences dropped as bad (maxErrors > 0) have
// no data; `slot_of` maps the chunk's index sequences to parsed sequences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/dataset_config.h"
#include "common/chunk/compressed.h"
#include "common/huge_pages.h"

namespace conveyor {

// Where a parsed stream's data lies, from its arrays' addresses (a null `in_place`: the data
// is columnar, else per parsed sequence where it lies in the input). ParsedStream's accessors
// and the CPU assembler's per-chunk view of its arrays both read through these.
// Sample `b` (of sequence `slot`) onwards, samples of `sample_bytes`.
inline const std::byte* DenseSampleAddress(const std::byte* columnar, const std::byte* const* in_place,
                                           const uint64_t* sequence_begin, uint32_t slot, uint64_t b,
                                           size_t sample_bytes) {
  return in_place == nullptr ? columnar + b * sample_bytes : in_place[slot] + (b - sequence_begin[slot]) * sample_bytes;
}
// Chunk-wide entry `k` (of sequence `slot`) onwards, elements of `elem_size`.
inline const std::byte* SparseEntryAddress(const std::byte* columnar, const std::byte* const* in_place,
                                           const uint64_t* sequence_begin, const uint64_t* nnz_begin, uint32_t slot,
                                           uint64_t k, size_t elem_size) {
  return in_place == nullptr ? columnar + k * elem_size
                             : in_place[slot] + (k - nnz_begin[sequence_begin[slot]]) * elem_size;
}

struct ParsedStream {
  StreamFormat format = StreamFormat::kDense;
  uint32_t dim = 0;
  // Sample range of parsed sequence i: [sequence_begin[i], sequence_begin[i+1]).
  HugeVector<uint64_t> sequence_begin{0};
  // Every parsed sequence has exactly one sample of this stream (sequence_begin[i] == i), as
  // NoteOneSampleStreams() found: planning then need not read sequence_begin (a cache miss a
  // piece when randomized). False says nothing.
  bool one_sample_each = false;
  // sparse: nnz range of sample j: [nnz_begin[j], nnz_begin[j+1]).
  HugeVector<uint64_t> nnz_begin{0};
  HugeVector<int32_t> indices;  // sparse row indices; ids for format ids
  // Values in the dataset's precision: exactly one of these is used.
  HugeVector<float> values_f32;
  HugeVector<double> values_f64;
  // Dense values used where they lie in the input (CBF: the chunk's bytes as read, held by
  // ParsedChunk::file_bytes; Kaldi FM/DM in the dataset's precision: the mapped file): per
  // parsed sequence, the address of its first sample's values, or empty when values<T>()
  // holds every sequence. Any alignment (readers copy with memcpy); valid while the chunk
  // and the Dataset that parsed it live. Read dense values through DenseSamples().
  HugeVector<const std::byte*> in_place;
  // Dense values left compressed (Dataset opened with compressed_in_place): per parsed
  // sequence, its payload (Kaldi CM, CM2, CM3; HTK frames and their windows); empty otherwise. Read them through DecodeDense(), not DenseSamples().
  std::vector<CompressedDense> compressed;
  // Sparse entries used where they lie in the input (CBF, ctf2bin's layout: the chunk's
  // bytes as read, ParsedChunk::file_bytes): per parsed sequence, the address of its first
  // entry's value and of its first index (a sequence's entries lie back to back, in file
  // order); both empty when values<T>() and `indices` hold every entry. Any alignment; valid
  // while the chunk lives. nnz_begin numbers the entries chunk-wide either way: read them through
  // SparseIndexBytes()/SparseValueBytes() (or SparseIndex()/SparseValue()).
  HugeVector<const std::byte*> sparse_values_in_place, sparse_indices_in_place;

  uint64_t num_samples(uint64_t seq) const { return sequence_begin[seq + 1] - sequence_begin[seq]; }
  // A dense stream's values of sample `b` (an index into this stream's samples, within parsed
  // sequence `slot`) onwards, for elements of `elem_size` bytes; the sequence's later samples
  // follow contiguously.
  const std::byte* DenseSamples(uint32_t slot, uint64_t b, size_t elem_size) const {
    return DenseSampleAddress(ValueBytes(elem_size), in_place.empty() ? nullptr : in_place.data(),
                              sequence_begin.data(), slot, b, dim * elem_size);
  }
  // values_f32's or values_f64's bytes, for elements of `elem_size`.
  const std::byte* ValueBytes(size_t elem_size) const {
    return elem_size == sizeof(float) ? reinterpret_cast<const std::byte*>(values_f32.data())
                                      : reinterpret_cast<const std::byte*>(values_f64.data());
  }
  // Samples [b, b + n) of parsed sequence `slot` into `out` (n x dim values), whichever way
  // the stream holds them: copied, or decoded by the payload's codec (compressed.h).
  template <typename T>
  void DecodeDense(uint32_t slot, uint64_t b, uint64_t n, T* out) const {
    if (compressed.empty()) {
      std::memcpy(out, DenseSamples(slot, b, sizeof(T)), n * dim * sizeof(T));
      return;
    }
    const CompressedDense& m = compressed[slot];
    CompressedWindow w;
    w.row0 = m.row0 + static_cast<int64_t>(b - sequence_begin[slot]);
    w.rows = static_cast<int64_t>(n);
    w.col0 = m.col0;
    w.cols = dim;
    DecodeCompressed(m, w, out);
  }
  // A sparse stream's entries from chunk-wide entry `k` (of parsed sequence `slot`) onwards,
  // as bytes: the sequence's later entries follow contiguously. Indices are int32, values
  // `elem_size` bytes.
  const std::byte* SparseIndexBytes(uint32_t slot, uint64_t k) const {
    return SparseEntryAddress(reinterpret_cast<const std::byte*>(indices.data()),
                              sparse_indices_in_place.empty() ? nullptr : sparse_indices_in_place.data(),
                              sequence_begin.data(), nnz_begin.data(), slot, k, sizeof(int32_t));
  }
  const std::byte* SparseValueBytes(uint32_t slot, uint64_t k, size_t elem_size) const {
    return SparseEntryAddress(ValueBytes(elem_size),
                              sparse_values_in_place.empty() ? nullptr : sparse_values_in_place.data(),
                              sequence_begin.data(), nnz_begin.data(), slot, k, elem_size);
  }
  int32_t SparseIndex(uint32_t slot, uint64_t k) const {
    if (sparse_indices_in_place.empty()) return indices[k];
    int32_t v;
    std::memcpy(&v, SparseIndexBytes(slot, k), sizeof(v));
    return v;
  }
  template <typename T>
  T SparseValue(uint32_t slot, uint64_t k) const {
    T v;
    std::memcpy(&v, SparseValueBytes(slot, k, sizeof(T)), sizeof(T));
    return v;
  }
  // Entries in the chunk (sparse).
  uint64_t total_entries() const { return nnz_begin.back(); }
  uint64_t total_samples() const { return sequence_begin.back(); }
  template <typename T>
  HugeVector<T>& values();
  template <typename T>
  const HugeVector<T>& values() const;
};

template <>
inline HugeVector<float>& ParsedStream::values<float>() { return values_f32; }
template <>
inline HugeVector<double>& ParsedStream::values<double>() { return values_f64; }
template <>
inline const HugeVector<float>& ParsedStream::values<float>() const { return values_f32; }
template <>
inline const HugeVector<double>& ParsedStream::values<double>() const { return values_f64; }

struct ParsedChunk {
  uint64_t chunk_id = 0;
  Precision precision = Precision::kFloat;
  std::vector<ParsedStream> streams;  // in the dataset's stream order
  HugeVector<uint64_t> keys;          // per parsed sequence
  std::vector<std::string> names;     // per parsed sequence, for string-keyed formats; else empty
  HugeVector<uint32_t> lengths;       // per parsed sequence: samples for minibatch counting
  HugeVector<int32_t> slot_of;        // per index sequence of the chunk: parsed slot or -1
  // Every index sequence of the chunk was kept: slot_of[j] == j (NoteIdentitySlots), so a
  // randomized read need not look its slot up (a miss a piece).
  bool identity_slots = false;
  // The chunk's bytes as read from its file, when its streams use values where they lie
  // (`in_place`, `sparse_*_in_place` point into them: CBF); empty otherwise.
  HugeBytes file_bytes;

  uint64_t num_sequences() const { return keys.size(); }
  // Approximate heap bytes held, for cache accounting.
  uint64_t MemoryBytes() const;
};

// Sets each stream's one_sample_each from its sequence_begin (one pass; Dataset::ParseChunk
// calls it on every chunk it parses).
void NoteOneSampleStreams(ParsedChunk* chunk);
// Sets identity_slots from slot_of (one pass; Dataset::ParseChunk calls it on every chunk).
void NoteIdentitySlots(ParsedChunk* chunk);

}  // namespace conveyor
