#include "common/chunk/parsed_chunk.h"

namespace conveyor {

uint64_t ParsedChunk::MemoryBytes() const {
  uint64_t b = keys.capacity() * 8 + lengths.capacity() * 4 + slot_of.capacity() * 4;
  for (const auto& s : streams) {
    b += s.sequence_begin.capacity() * 8 + s.nnz_begin.capacity() * 8 + s.indices.capacity() * 4 +
         s.values_f32.capacity() * 4 + s.values_f64.capacity() * 8 + s.in_place.capacity() * sizeof(const std::byte*) +
         s.compressed.capacity() * sizeof(CompressedDense) +
         (s.sparse_values_in_place.capacity() + s.sparse_indices_in_place.capacity()) * sizeof(const std::byte*);
  }
  return b;
}

}  // namespace conveyor
