// sweep_order.h: the delivery order of one sweep, as a pure function of (index, seed,
// sweep). conveyor's block randomization (docs/randomization.md has the exact algorithm):
//  1. chunks are shuffled as CNTK does: mt19937_64 seeded with seed + sweep, and for i in
//     0..n-1 swap(order[i], order[rng() % n]);
//  2. each unit (a sequence, or a frame in frame mode) of the chunk at randomized position
//     c gets the key  base(c) + spread * h / 2^32  where h is a 32-bit hash of
//     (seed + sweep, sequence, frame), base(c) is c (chunk windows) or the sample offset of
//     c (sample windows), and spread is the window (W chunks or R samples);
//  3. units are delivered in (key, sequence, frame) order.
// So a unit of chunk c is delivered among the units of the W chunks before it: a rolling
// window, as CNTK's, but one whose content at any point is computable from the window
// alone. The order is cut into segments (segment i = keys in [base(i), base(i+1))); the
// units of segment i come only from chunks lo(i)..i, so reading segment i needs those
// chunks and nothing else, and starting (or resuming) at any segment costs O(window).
// randomize: false is the same machinery with the identity chunk order and spread 0.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/types/span.h"
#include "common/huge_pages.h"
#include "common/index/index.h"

namespace conveyor {

struct RandomizerOptions {
  bool randomize = false;
  uint64_t seed = 0;            // randomizationSeed; sweep k uses seed + k
  bool sample_window = false;   // sampleBasedRandomizationWindow
  uint64_t window = 0;          // chunks, or samples when sample_window; 0: CNTK's default
  bool frame_mode = false;      // units are frames (one per sample) instead of sequences
};

// The CNTK default window: 4 GiB worth of chunks (128 at 32 MiB), or the whole sweep in samples.
uint64_t DefaultRandomizationWindow(const Index& index, uint64_t chunk_size, bool sample_window);

// Step 1 alone: the chunk at each randomized position of `sweep` (identity in file order).
std::vector<uint32_t> ChunkOrder(uint64_t num_chunks, const RandomizerOptions& options, uint64_t sweep);

struct Unit {
  static constexpr uint32_t kWholeSequence = UINT32_MAX;
  uint64_t sequence = 0;  // index into Index::sequences
  uint32_t frame = kWholeSequence;
  uint32_t samples = 0;   // for minibatch counting (1 for a frame)
  uint32_t chunk = 0;     // chunk id (file order)
  uint32_t position = 0;  // the chunk's randomized position this sweep (ranks own positions)
};

// Step 3 for one segment: `units`, whose keys less the segment's base are `keys` (one each,
// parallel), appended to *out in (key, sequence, frame) order. A radix sort of the keys and
// then, for the rare runs of equal keys, a sort by (sequence, frame): the same order as one
// comparison sort. Declared for tests; SweepOrder calls it.
void SortSegment(absl::Span<const uint64_t> keys, absl::Span<const Unit> units, HugeVector<Unit>* out);

class SweepOrder {
 public:
  // `index` must outlive the object; `window` already resolved (non-zero when randomizing).
  SweepOrder(const Index* index, const RandomizerOptions& options, uint64_t sweep);

  uint64_t num_segments() const { return order_.size(); }
  // The chunk id at randomized position `pos`.
  uint32_t chunk_at(uint64_t pos) const { return order_[pos]; }
  // The lowest randomized position whose units can land in segment `i`.
  uint64_t FirstContributor(uint64_t i) const;
  // The last segment the units of randomized position `pos` can land in (non-decreasing).
  uint64_t LastSegment(uint64_t pos) const;

  // The units of segment `i` in delivery order. Segments must be asked for in increasing
  // order; the first call may start anywhere (a seek costs O(window)). The reference stays
  // valid until the next call.
  const HugeVector<Unit>& Segment(uint64_t i);

 private:
  // The units a segment will deliver, gathered as their chunks are distributed, with their
  // keys less base(segment) << 32 (`keys`), or, when one of those does not fit 64 bits
  // (sample windows of more than 2^32 samples), no keys (`wide`): the segment is then sorted
  // on full keys computed again.
  struct Bucket {
    HugeVector<uint64_t> keys;
    HugeVector<Unit> units;
    bool wide = false;
  };
  void Distribute(uint64_t pos);  // computes the keys of one chunk's units into buckets
  // Distribute() of chunk windows up to kMaxTableSpread chunks wide (sweep_order.cc).
  static constexpr uint64_t kMaxTableSpread = 1024;
  void DistributeByTable(uint64_t pos);
  void EnsureBuckets(uint64_t seg);  // the buckets of every segment up to `seg` exist
  unsigned __int128 Key(uint64_t pos, uint64_t sequence, uint32_t frame) const;
  // About how many units segment `i` will get (0: not worth counting), to reserve its bucket.
  uint64_t ExpectedUnits(uint64_t i) const;
  void SortWide(Bucket* b);  // appends b's units to segment_ in (key, sequence, frame) order

  const Index* const index_;
  const RandomizerOptions options_;
  const uint64_t sweep_seed_;
  std::vector<uint32_t> order_;   // randomized position -> chunk id
  std::vector<uint64_t> base_;    // size n+1, in window units
  uint64_t spread_ = 0;
  std::deque<Bucket> buckets_;  // segment first_bucket_ + i -> its units
  uint64_t first_bucket_ = 0;
  uint64_t next_to_distribute_ = 0;
  bool started_ = false;
  uint64_t current_ = 0;
  HugeVector<Unit> segment_;
};

}  // namespace conveyor
