#include "common/sampling/sweep_order.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace conveyor {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t DefaultRandomizationWindow(const Index& index, uint64_t chunk_size, bool sample_window) {
  if (sample_window) return std::max<uint64_t>(1, index.total_samples);
  return std::max<uint64_t>(1, (4ull << 30) / std::max<uint64_t>(1, chunk_size));
}

std::vector<uint32_t> ChunkOrder(uint64_t n, const RandomizerOptions& options, uint64_t sweep) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (options.randomize && n > 1) {
    // CNTK's RandomShuffleMT: not Fisher-Yates, no std distribution: platform-stable.
    std::mt19937_64 rng(options.seed + sweep);
    for (uint64_t i = 0; i < n; ++i) std::swap(order[i], order[rng() % n]);
  }
  return order;
}

SweepOrder::SweepOrder(const Index* index, const RandomizerOptions& options, uint64_t sweep)
    : index_(index), options_(options), sweep_seed_(options.seed + sweep) {
  const uint64_t n = index_->chunks.size();
  order_ = ChunkOrder(n, options, sweep);
  base_.resize(n + 1);
  base_[0] = 0;
  for (uint64_t i = 0; i < n; ++i) {
    base_[i + 1] = base_[i] + (options_.sample_window ? index_->chunks[order_[i]].num_samples : 1);
  }
  spread_ = options_.randomize ? options_.window : 0;
}

uint64_t SweepOrder::FirstContributor(uint64_t i) const {
  if (spread_ == 0) return i;
  // Chunk j can reach segment i when base(j) + spread > base(i).
  const uint64_t b = base_[i];
  if (b < spread_) return 0;
  const uint64_t threshold = b - spread_;  // need base(j) > threshold
  return std::upper_bound(base_.begin(), base_.begin() + i, threshold) - base_.begin();
}

uint64_t SweepOrder::LastSegment(uint64_t pos) const {
  if (spread_ == 0) return pos;
  const uint64_t top = base_[pos] + spread_ - 1;  // the largest whole part a key can have
  const uint64_t seg = std::upper_bound(base_.begin() + pos, base_.end(), top) - base_.begin() - 1;
  return std::min<uint64_t>(seg, order_.size() - 1);
}

void SweepOrder::Distribute(uint64_t pos) {
  const uint32_t chunk = order_[pos];
  const ChunkEntry& c = index_->chunks[chunk];
  const uint64_t n = order_.size();
  for (uint64_t s = c.first_sequence; s < c.first_sequence + c.num_sequences; ++s) {
    const SequenceEntry& e = index_->sequences[s];
    const uint32_t frames = options_.frame_mode ? e.num_samples : 1;
    for (uint32_t f = 0; f < frames; ++f) {
      Unit u;
      u.sequence = s;
      u.frame = options_.frame_mode ? f : Unit::kWholeSequence;
      u.samples = options_.frame_mode ? 1 : e.num_samples;
      u.chunk = chunk;
      u.position = static_cast<uint32_t>(pos);
      // Only randomized sweeps come here (file order builds its segments directly).
      const uint64_t h = SplitMix64(sweep_seed_ ^ SplitMix64((s << 24) ^ f)) >> 32;
      const unsigned __int128 key =
          (static_cast<unsigned __int128>(base_[pos]) << 32) + static_cast<unsigned __int128>(spread_) * h;
      // The segment whose [base(i), base(i+1)) holds the key (bases are 0,1,2,... for
      // chunk windows: no search needed).
      const uint64_t whole = static_cast<uint64_t>(key >> 32);
      uint64_t seg = options_.sample_window
                         ? std::upper_bound(base_.begin() + pos, base_.end(), whole) - base_.begin() - 1
                         : whole;
      if (seg >= n) seg = n - 1;
      if (seg < first_bucket_) continue;  // before the segment a seek started at
      while (first_bucket_ + buckets_.size() <= seg) buckets_.emplace_back();
      buckets_[seg - first_bucket_].push_back({key, u});
    }
  }
}

const std::vector<Unit>& SweepOrder::Segment(uint64_t i) {
  if (!started_) {
    started_ = true;
    first_bucket_ = i;
    next_to_distribute_ = FirstContributor(i);
  }
  // Drop the buckets of segments before i (asked for in increasing order).
  while (first_bucket_ < i) {
    if (!buckets_.empty()) buckets_.pop_front();
    ++first_bucket_;
  }
  current_ = i;
  segment_.clear();
  if (spread_ == 0) {  // file order: segment i is the units of chunk i, in order; no keys
    const uint32_t chunk = order_[i];
    const ChunkEntry& c = index_->chunks[chunk];
    segment_.reserve(options_.frame_mode ? c.num_samples : c.num_sequences);
    for (uint64_t s = c.first_sequence; s < c.first_sequence + c.num_sequences; ++s) {
      const uint32_t samples = index_->sequences[s].num_samples;
      Unit u;
      u.sequence = s;
      u.chunk = chunk;
      u.position = static_cast<uint32_t>(i);
      if (!options_.frame_mode) {
        u.samples = samples;
        segment_.push_back(u);
        continue;
      }
      u.samples = 1;
      for (uint32_t f = 0; f < samples; ++f) {
        u.frame = f;
        segment_.push_back(u);
      }
    }
    return segment_;
  }
  while (next_to_distribute_ <= i && next_to_distribute_ < order_.size()) Distribute(next_to_distribute_++);
  if (!buckets_.empty()) {
    std::vector<Keyed>& b = buckets_.front();
    std::sort(b.begin(), b.end(), [](const Keyed& x, const Keyed& y) {
      if (x.key != y.key) return x.key < y.key;
      if (x.unit.sequence != y.unit.sequence) return x.unit.sequence < y.unit.sequence;
      return x.unit.frame < y.unit.frame;
    });
    segment_.reserve(b.size());
    for (const Keyed& k : b) segment_.push_back(k.unit);
    std::vector<Keyed>().swap(b);
  }
  return segment_;
}

}  // namespace conveyor
