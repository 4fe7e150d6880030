// Generated indexes for planner-level tests (no file behind them).
#pragma once

#include <cstdint>
#include <random>

#include "common/index/index.h"

namespace conveyor {

// `n` sequences of 1..max_len samples (drawn with `seed`), chunks of about `per_chunk`
// sequences; every sequence record is 100 bytes.
inline Index MakeIndex(uint64_t n, uint32_t max_len, uint64_t per_chunk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Index index;
  uint64_t offset = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t len = 1 + static_cast<uint32_t>(rng() % max_len);
    index.sequences.push_back({i, offset, i, 100, len});
    offset += 100;
  }
  index.BuildChunks(per_chunk * 100);
  return index;
}

}  // namespace conveyor
