#include "common/sampling/sweep_order.h"

#include <algorithm>
#include <array>
#include <new>
#include <numeric>
#include <random>

#include "absl/functional/function_ref.h"

namespace conveyor {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The tie-break of equal keys: (sequence, frame).
bool UnitBefore(const Unit& x, const Unit& y) {
  return x.sequence != y.sequence ? x.sequence < y.sequence : x.frame < y.frame;
}

// LSD radix sort of `items` by key, a byte a pass, over the bytes in which keys differ
// (stable; `tmp` is scratch of the same size).
struct KeyIndex {
  uint64_t key;
  uint64_t index;
};

void RadixSortByKey(HugeVector<KeyIndex>* items, HugeVector<KeyIndex>* tmp) {
  const size_t n = items->size();
  // Every byte's histogram in one pass.
  std::vector<std::array<uint64_t, 256>> counts(8);
  for (auto& c : counts) c.fill(0);
  uint64_t any = 0;
  for (const KeyIndex& x : *items) {
    any |= x.key;
    for (int d = 0; d < 8; ++d) ++counts[d][(x.key >> (8 * d)) & 0xff];
  }
  tmp->resize(n);
  for (int d = 0; d < 8 && (any >> (8 * d)) != 0; ++d) {
    std::array<uint64_t, 256>& c = counts[d];
    if (c[((*items)[0].key >> (8 * d)) & 0xff] == n) continue;  // one digit: nothing moves
    uint64_t at = 0;
    for (uint64_t& x : c) {
      const uint64_t k = x;
      x = at;
      at += k;
    }
    for (const KeyIndex& x : *items) (*tmp)[c[(x.key >> (8 * d)) & 0xff]++] = x;
    items->swap(*tmp);
  }
}

// LSD radix sort of packed items (a key above bit `shift`, an index below it) by their bits
// [shift, shift + key_bits), a digit of 8 or 11 bits a pass (11 where that saves a pass and
// the items are many enough to fill its counts), skipping digits in which all agree (stable:
// equal keys stay in index order; `tmp` is scratch). Half the bytes a pass of KeyIndex moves.
void RadixSortPacked(HugeVector<uint64_t>* items, HugeVector<uint64_t>* tmp, int shift, int key_bits) {
  const size_t n = items->size();
  const int width = n >= 2048 && (key_bits + 10) / 11 < (key_bits + 7) / 8 ? 11 : 8;
  const size_t radix = size_t{1} << width;
  const uint64_t digit_mask = radix - 1;
  const int digits = (key_bits + width - 1) / width;
  std::vector<uint64_t> counts(digits * radix, 0);
  for (uint64_t x : *items) {
    for (int d = 0; d < digits; ++d) ++counts[d * radix + ((x >> (shift + width * d)) & digit_mask)];
  }
  tmp->resize(n);
  for (int d = 0; d < digits; ++d) {
    const int at_bit = shift + width * d;
    uint64_t* const c = counts.data() + d * radix;
    if (c[((*items)[0] >> at_bit) & digit_mask] == n) continue;  // one digit: nothing moves
    uint64_t at = 0;
    for (size_t k = 0; k < radix; ++k) {
      const uint64_t count = c[k];
      c[k] = at;
      at += count;
    }
    uint64_t* const to = tmp->data();
    for (uint64_t x : *items) to[c[(x >> at_bit) & digit_mask]++] = x;
    items->swap(*tmp);
  }
}

// Appends units[index] for each index, in order: a gather in random order from `units` (tens
// of MB for a whole-sweep window), each unit asked for a stretch ahead so the misses overlap.
template <typename IndexOf>
void GatherUnits(size_t n, IndexOf index_of, absl::Span<const Unit> units, HugeVector<Unit>* out) {
  constexpr size_t kAhead = 32;
  out->reserve(out->size() + n);
  for (size_t j = 0; j < n; ++j) {
    if (j + kAhead < n) __builtin_prefetch(&units[index_of(j + kAhead)]);
    out->push_back(units[index_of(j)]);
  }
}

// A segment of more units than kSplitAbove (a sweep's last one under a whole-sweep window:
// a million units and more) is sorted in runs that fit the cache (SortSegmentInRuns), not by
// passes over all of it: each pass of a radix sort over tens of MB, and the gather of its
// units in random order from as many, miss the cache on every item.
constexpr size_t kSplitAbove = size_t{1} << 16;
constexpr size_t kRunItems = size_t{1} << 12;  // about 128 KB of keys and units a run

void SortSegmentInRuns(absl::Span<const uint64_t> keys, absl::Span<const Unit> units, int key_bits,
                       absl::FunctionRef<void()> release, HugeVector<Unit>* out);

// SortSegment(), and where it sorts in runs, release() called once `keys` and `units` are
// read (SweepOrder frees its bucket then).
void SortSegmentReleasing(absl::Span<const uint64_t> keys, absl::Span<const Unit> units,
                          absl::FunctionRef<void()> release, HugeVector<Unit>* out) {
  const size_t n = keys.size();
  uint64_t any = 0;
  for (uint64_t k : keys) any |= k;
  const int key_bits = any == 0 ? 0 : 64 - __builtin_clzll(any);
  if (n > kSplitAbove && key_bits > 8) {
    SortSegmentInRuns(keys, units, key_bits, release, out);
    return;
  }
  const int index_bits = n <= 1 ? 0 : 64 - __builtin_clzll(n - 1);
  if (n > 64 && key_bits + index_bits <= 64) {
    // Key and index in one word (a sweep's keys span about 40 bits, its units 20-30).
    const uint64_t mask = (uint64_t{1} << index_bits) - 1;
    HugeVector<uint64_t> items(n), tmp;
    for (size_t j = 0; j < n; ++j) items[j] = (key_bits == 0 ? 0 : keys[j] << index_bits) | j;
    RadixSortPacked(&items, &tmp, index_bits, key_bits);
    tmp = HugeVector<uint64_t>();
    // Equal keys (a 32-bit hash collision, or keys of two chunks that meet): by (sequence, frame).
    for (size_t j = 0; j + 1 < n;) {
      size_t e = j + 1;
      while (e < n && (items[e] >> index_bits) == (items[j] >> index_bits)) ++e;
      if (e - j > 1) {
        std::sort(items.begin() + j, items.begin() + e,
                  [&](uint64_t x, uint64_t y) { return UnitBefore(units[x & mask], units[y & mask]); });
      }
      j = e;
    }
    GatherUnits(n, [&](size_t j) { return items[j] & mask; }, units, out);
    return;
  }
  HugeVector<KeyIndex> items(n);
  for (size_t j = 0; j < n; ++j) items[j] = {keys[j], j};
  auto before = [&](const KeyIndex& x, const KeyIndex& y) {
    if (x.key != y.key) return x.key < y.key;
    return UnitBefore(units[x.index], units[y.index]);
  };
  if (n <= 64) {
    std::sort(items.begin(), items.end(), before);
  } else {
    HugeVector<KeyIndex> tmp;
    RadixSortByKey(&items, &tmp);
    // Equal keys (a 32-bit hash collision, or keys of two chunks that meet): by (sequence, frame).
    for (size_t j = 0; j + 1 < n;) {
      size_t e = j + 1;
      while (e < n && items[e].key == items[j].key) ++e;
      if (e - j > 1) std::sort(items.begin() + j, items.begin() + e, before);
      j = e;
    }
  }
  GatherUnits(n, [&](size_t j) { return items[j].index; }, units, out);
}

}  // namespace

void SortSegment(absl::Span<const uint64_t> keys, absl::Span<const Unit> units, HugeVector<Unit>* out) {
  SortSegmentReleasing(keys, units, [] {}, out);
}

namespace {

// One pass moves each key and its unit into the run of the key's top `r` bits (the runs in
// key order, each holding its items in their order), keeping only the key's low bits; each
// run is then sorted as a segment of its own, where it lies in cache. The same order as
// sorting all at once: a key's top bits order the runs, its low bits and the tie-break
// (equal keys share a run) order each run.
// Memory: the runs hold a copy of the keys and units (32 bytes a unit) until sorted; the
// caller's bucket goes once they are copied (release()), so that with SweepOrder::Segment()
// giving up its room from an earlier segment first, at most the bucket and the runs are held
// at once (the packed sort holds the bucket, two 8-byte arrays and that room).
void SortSegmentInRuns(absl::Span<const uint64_t> keys, absl::Span<const Unit> units, int key_bits,
                       absl::FunctionRef<void()> release, HugeVector<Unit>* out) {
  const size_t n = keys.size();
  int r = 1;
  while (r < 16 && r < key_bits && (n >> r) > kRunItems) ++r;
  const int shift = key_bits - r;
  const uint64_t low = (uint64_t{1} << shift) - 1;  // shift < 64: r >= 1
  std::vector<uint64_t> at((size_t{1} << r) + 1, 0);
  for (uint64_t k : keys) ++at[(k >> shift) + 1];
  for (size_t d = 1; d < at.size(); ++d) at[d] += at[d - 1];
  const std::vector<uint64_t> bounds = at;  // run d is [bounds[d], bounds[d + 1])
  // Left as they are until written (no zeroing pass over tens of MB), from reused blocks.
  HugeBytes key_bytes(n * sizeof(uint64_t)), unit_bytes(n * sizeof(Unit));
  uint64_t* const run_keys = reinterpret_cast<uint64_t*>(key_bytes.data());
  Unit* const run_units = reinterpret_cast<Unit*>(unit_bytes.data());
  for (size_t j = 0; j < n; ++j) {
    const uint64_t t = at[keys[j] >> shift]++;
    run_keys[t] = keys[j] & low;
    new (&run_units[t]) Unit(units[j]);
  }
  release();  // `keys` and `units` may go now
  out->reserve(out->size() + n);
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    const uint64_t b = bounds[d], e = bounds[d + 1];
    if (e > b) SortSegment(absl::MakeConstSpan(run_keys + b, e - b), absl::MakeConstSpan(run_units + b, e - b), out);
  }
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

// Inlined by force: Distribute() computes one a unit, and the call cost a third of the key.
__attribute__((always_inline)) inline unsigned __int128 SweepOrder::Key(uint64_t pos, uint64_t sequence,
                                                                         uint32_t frame) const {
  const uint64_t h = SplitMix64(sweep_seed_ ^ SplitMix64((sequence << 24) ^ frame)) >> 32;
  return (static_cast<unsigned __int128>(base_[pos]) << 32) + static_cast<unsigned __int128>(spread_) * h;
}

void SweepOrder::EnsureBuckets(uint64_t seg) {
  while (first_bucket_ + buckets_.size() <= seg) {
    // Reserved once: grown by doubling, a whole-sweep window's one bucket was copied
    // and faulted in about twice over.
    buckets_.emplace_back();
    const uint64_t expected = ExpectedUnits(first_bucket_ + buckets_.size() - 1);
    buckets_.back().keys.reserve(expected);
    buckets_.back().units.reserve(expected);
  }
}

void SweepOrder::Distribute(uint64_t pos) {
  const uint32_t chunk = order_[pos];
  const ChunkEntry& c = index_->chunks[chunk];
  const uint64_t n = order_.size();
  if (!options_.sample_window && spread_ >= 1 && spread_ <= kMaxTableSpread) {
    DistributeByTable(pos);
    return;
  }
  uint64_t bucket_seg = UINT64_MAX;  // the segment of the last unit, and its bucket
  Bucket* bucket = nullptr;
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
      const unsigned __int128 key = Key(pos, s, f);
      // The segment whose [base(i), base(i+1)) holds the key (bases are 0,1,2,... for
      // chunk windows: no search needed).
      const uint64_t whole = static_cast<uint64_t>(key >> 32);
      uint64_t seg = options_.sample_window
                         ? std::upper_bound(base_.begin() + pos, base_.end(), whole) - base_.begin() - 1
                         : whole;
      if (seg >= n) seg = n - 1;
      if (seg < first_bucket_) continue;  // before the segment a seek started at
      if (seg != bucket_seg) {  // (a whole-sweep window: every unit in the last segment)
        EnsureBuckets(seg);
        bucket = &buckets_[seg - first_bucket_];  // (a deque's emplace_back moves no element)
        bucket_seg = seg;
      }
      Bucket& b = *bucket;
      // key >= base(seg) << 32: the segment holds keys from its base on.
      const unsigned __int128 rel = key - (static_cast<unsigned __int128>(base_[seg]) << 32);
      b.wide = b.wide || (rel >> 64) != 0;
      b.keys.push_back(static_cast<uint64_t>(rel));
      b.units.push_back(u);
    }
  }
}

// Distribute() for chunk windows of up to kMaxTableSpread chunks (every randomized read but
// sample windows and whole-sweep windows of many chunks): base(p) = p, so a unit's key is
// (pos << 32) + spread * h, its segment pos + (spread * h >> 32) (at most the last), and the
// buckets it can land in are the next `spread` ones, looked up in a table instead of
// compared with the last unit's (a unit lands in another bucket than the one before nearly
// every time: a branch mispredicted a unit). The same keys, buckets and order as Distribute().
void SweepOrder::DistributeByTable(uint64_t pos) {
  const uint32_t chunk = order_[pos];
  const ChunkEntry& c = index_->chunks[chunk];
  const uint64_t n = order_.size();
  const uint64_t spread = spread_;  // >= 1 when randomizing, < 2^32: spread * h fits 64 bits
  const uint64_t last = std::min(pos + spread - 1, n - 1) - pos;  // the highest offset a unit reaches
  EnsureBuckets(pos + last);
  // table[d]: the bucket of segment pos + d; null before the segment a seek started at.
  std::array<Bucket*, kMaxTableSpread> table;
  for (uint64_t d = 0; d <= last; ++d) {
    table[d] = pos + d < first_bucket_ ? nullptr : &buckets_[pos + d - first_bucket_];
  }
  const bool frame_mode = options_.frame_mode;
  const SequenceEntry* sequences = index_->sequences.data();
  for (uint64_t s = c.first_sequence; s < c.first_sequence + c.num_sequences; ++s) {
    const uint32_t samples = sequences[s].num_samples;
    const uint32_t frames = frame_mode ? samples : 1;
    for (uint32_t f = 0; f < frames; ++f) {
      const uint64_t h = SplitMix64(sweep_seed_ ^ SplitMix64((s << 24) ^ f)) >> 32;
      const uint64_t spreadh = spread * h;
      const uint64_t d = std::min(spreadh >> 32, last);
      Bucket* b = table[d];
      if (b == nullptr) continue;  // before the segment a seek started at
      b->keys.push_back(spreadh - (d << 32));  // the key less base(pos + d) << 32
      Unit& u = b->units.emplace_back();
      u.sequence = s;
      u.frame = frame_mode ? f : Unit::kWholeSequence;
      u.samples = frame_mode ? 1 : samples;
      u.chunk = chunk;
      u.position = static_cast<uint32_t>(pos);
    }
  }
}

uint64_t SweepOrder::ExpectedUnits(uint64_t i) const {
  // Each position p that can reach segment i spreads its units uniformly over the whole
  // parts [base(p), base(p) + spread); segment i takes those in [base(i), base(i+1)) (the
  // last one, all from base(i) on). A sum over the window, skipped for very wide ones.
  constexpr uint64_t kMaxPositions = 4096;
  const uint64_t n = order_.size();
  const uint64_t lo = FirstContributor(i);
  if (i - lo > kMaxPositions || spread_ == 0) return 0;
  const uint64_t begin = base_[i];
  const uint64_t end = i + 1 < n ? base_[i + 1] : UINT64_MAX;
  double expected = 0;
  for (uint64_t p = lo; p <= i; ++p) {
    const ChunkEntry& c = index_->chunks[order_[p]];
    const uint64_t units = options_.frame_mode ? c.num_samples : c.num_sequences;
    const uint64_t top = base_[p] + std::min(spread_, UINT64_MAX - base_[p]);
    const uint64_t from = std::max(base_[p], begin), to = std::min(top, end);
    if (to > from) expected += static_cast<double>(units) * static_cast<double>(to - from) / static_cast<double>(spread_);
  }
  // A margin of many standard deviations (counts are sums of binomials): rarely exceeded.
  return static_cast<uint64_t>(expected * 1.1) + 256;
}

void SweepOrder::SortWide(Bucket* b) {
  const size_t n = b->units.size();
  std::vector<unsigned __int128> keys(n);
  for (size_t j = 0; j < n; ++j) {
    const Unit& u = b->units[j];
    keys[j] = Key(u.position, u.sequence, options_.frame_mode ? u.frame : 0);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (keys[x] != keys[y]) return keys[x] < keys[y];
    return UnitBefore(b->units[x], b->units[y]);
  });
  segment_.reserve(n);
  for (size_t j : order) segment_.push_back(b->units[j]);
}

const HugeVector<Unit>& SweepOrder::Segment(uint64_t i) {
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
    const SequenceEntry* entries = index_->sequences.data() + c.first_sequence;
    if (!options_.frame_mode) {  // one unit a sequence, written in place
      segment_.resize(c.num_sequences);
      Unit* out = segment_.data();
      for (uint64_t k = 0; k < c.num_sequences; ++k) {
        out[k].sequence = c.first_sequence + k;
        out[k].frame = Unit::kWholeSequence;
        out[k].samples = entries[k].num_samples;
        out[k].chunk = chunk;
        out[k].position = static_cast<uint32_t>(i);
      }
      return segment_;
    }
    segment_.reserve(c.num_samples);
    for (uint64_t k = 0; k < c.num_sequences; ++k) {
      for (uint32_t f = 0; f < entries[k].num_samples; ++f) {
        // Written in place: one Unit on the stack with its frame changed and then copied
        // stalled each frame on its 16-byte reload of the 4 bytes just stored (90% of this
        // function in a frame-mode profile).
        Unit& u = segment_.emplace_back();
        u.sequence = c.first_sequence + k;
        u.frame = f;
        u.samples = 1;
        u.chunk = chunk;
        u.position = static_cast<uint32_t>(i);
      }
    }
    return segment_;
  }
  while (next_to_distribute_ <= i && next_to_distribute_ < order_.size()) Distribute(next_to_distribute_++);
  if (!buckets_.empty()) {
    Bucket& b = buckets_.front();
    if (b.wide) {
      SortWide(&b);
    } else {
      // Sorted in runs: the room of an earlier segment goes first (see SortSegmentInRuns).
      if (b.units.size() > kSplitAbove) segment_ = HugeVector<Unit>();
      SortSegmentReleasing(b.keys, b.units, [&b] { b = Bucket(); }, &segment_);
    }
    b = Bucket();  // its memory goes now, not when the segment is dropped
  }
  return segment_;
}

}  // namespace conveyor
