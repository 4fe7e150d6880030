// hash.h: a fast, platform-stable 64-bit hash (word-wise multiply-mix, ~8 bytes a cycle-ish),
// for checksums and fingerprints. Not cryptographic. Stable across machines and builds:
// cursors and index caches depend on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace conveyor {

inline uint64_t Mix64(uint64_t h, uint64_t v) {
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}

// Hashes `size` bytes (little-endian words, then the tail, then the length).
inline uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0x9e3779b97f4a7c15ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = Mix64(h, w);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < size; ++k) tail |= static_cast<uint64_t>(p[i + k]) << (8 * k);
  h = Mix64(h, tail);
  return Mix64(h, size);
}

}  // namespace conveyor
