#include "common/chunk/parsed_chunk.h"

namespace conveyor {

uint64_t ParsedChunk::MemoryBytes() const {
  // What each array holds: its capacity, or the whole block a large one lives in.
  auto held = [](const auto& v) { return HeldBytes(v.data(), v.capacity() * sizeof(v[0])); };
  uint64_t b = held(keys) + held(lengths) + held(slot_of) + file_bytes.held();
  for (const auto& s : streams) {
    b += held(s.sequence_begin) + held(s.nnz_begin) + held(s.indices) + held(s.values_f32) + held(s.values_f64) +
         held(s.in_place) + s.compressed.capacity() * sizeof(CompressedDense) + held(s.sparse_values_in_place) +
         held(s.sparse_indices_in_place);
  }
  return b;
}

void NoteOneSampleStreams(ParsedChunk* chunk) {
  const uint64_t n = chunk->num_sequences();
  for (ParsedStream& ps : chunk->streams) {
    bool one = ps.sequence_begin.size() == n + 1;
    for (uint64_t i = 0; one && i <= n; ++i) one = ps.sequence_begin[i] == i;
    ps.one_sample_each = one;
  }
}

void NoteIdentitySlots(ParsedChunk* chunk) {
  bool identity = chunk->slot_of.size() == chunk->num_sequences();
  for (size_t j = 0; identity && j < chunk->slot_of.size(); ++j) identity = chunk->slot_of[j] == static_cast<int32_t>(j);
  chunk->identity_slots = identity;
}

}  // namespace conveyor
