// Property tests of the delivery order over generated indexes and many seeds: exactly once
// per epoch, determinism, windows, ranks, resume from every boundary, elastic resume,
// frame mode and truncated BPTT. Planner-level: no parsing, so thousands of cases run fast.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/sampling/cursor.h"
#include "common/sampling/planner.h"
#include "common/sampling/sweep_order.h"
#include "gtest/gtest.h"
#include "tests/common/sampling/planner_test_util.h"

namespace conveyor {
namespace {

struct Delivered {
  uint64_t epoch, batch;
  uint64_t sequence;
  uint32_t frame, sample_begin, sample_count;
  uint32_t chunk;
};

std::vector<Delivered> RunPlanner(Planner* p, std::vector<PlannedBatch>* batches = nullptr) {
  std::vector<Delivered> out;
  while (auto b = p->Next()) {
    for (const Piece& piece : b->pieces)
      out.push_back({b->epoch, b->batch, piece.sequence, piece.frame, piece.sample_begin, piece.sample_count, piece.chunk});
    if (batches) batches->push_back(std::move(*b));
  }
  return out;
}

PlannerOptions Randomized(uint64_t seed, uint64_t window, uint64_t mb = 17) {
  PlannerOptions o;
  o.minibatch_size = mb;
  o.randomizer.randomize = true;
  o.randomizer.seed = seed;
  o.randomizer.window = window;
  return o;
}

std::vector<uint64_t> Sequences(const std::vector<Delivered>& d, uint64_t epoch) {
  std::vector<uint64_t> out;
  for (const auto& x : d)
    if (x.epoch == epoch) out.push_back(x.sequence);
  return out;
}

TEST(Randomizer, EachEpochDeliversEverySequenceExactlyOnce) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Index index = MakeIndex(200 + seed * 7, 5, 1 + seed % 9, seed);
    PlannerOptions o = Randomized(seed, 1 + seed % 6);
    o.epochs = 3;
    auto p = Planner::Create(&index, o);
    ASSERT_TRUE(p.ok());
    auto d = RunPlanner(p->get());
    for (uint64_t e = 0; e < 3; ++e) {
      std::vector<uint64_t> s = Sequences(d, e);
      std::sort(s.begin(), s.end());
      ASSERT_EQ(s.size(), index.sequences.size()) << "seed " << seed << " epoch " << e;
      for (uint64_t i = 0; i < s.size(); ++i) ASSERT_EQ(s[i], i);
    }
  }
}

TEST(Randomizer, SameSeedSameOrderDifferentSeedDifferentOrder) {
  Index index = MakeIndex(500, 3, 10, 1);
  auto order = [&](uint64_t seed) {
    auto p = Planner::Create(&index, Randomized(seed, 8));
    return Sequences(RunPlanner(p->get()), 0);
  };
  EXPECT_EQ(order(7), order(7));
  EXPECT_NE(order(7), order(8));
  std::vector<uint64_t> file(500);
  for (uint64_t i = 0; i < 500; ++i) file[i] = i;
  EXPECT_NE(order(7), file);
}

TEST(Randomizer, SweepKUsesSeedPlusK) {
  // CNTK's test_random_seed: seed 0 sweep 1 equals seed 1 sweep 0.
  Index index = MakeIndex(300, 2, 7, 3);
  PlannerOptions a = Randomized(0, 5);
  a.epochs = 2;
  auto pa = Planner::Create(&index, a);
  auto b = Planner::Create(&index, Randomized(1, 5));
  EXPECT_EQ(Sequences(RunPlanner(pa->get()), 1), Sequences(RunPlanner(b->get()), 0));
}

TEST(Randomizer, ChunkShuffleIsCntksRandomShuffleMT) {
  // for i: swap(v[i], v[rng() % n]) with mt19937_64(seed + sweep): computed independently here.
  Index index = MakeIndex(100, 1, 10, 0);  // 10 chunks
  RandomizerOptions o;
  o.randomize = true;
  o.seed = 11;
  o.window = 2;
  SweepOrder order(&index, o, 3);
  std::vector<uint32_t> expected(10);
  for (uint32_t i = 0; i < 10; ++i) expected[i] = i;
  std::mt19937_64 rng(14);
  for (uint32_t i = 0; i < 10; ++i) std::swap(expected[i], expected[rng() % 10]);
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(order.chunk_at(i), expected[i]);
}

TEST(Randomizer, SequencesNeverLeaveTheirWindow) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    const uint64_t window = 1 + seed % 5;
    Index index = MakeIndex(400, 4, 1 + seed % 7, seed);
    RandomizerOptions ro;
    ro.randomize = true;
    ro.seed = seed;
    ro.window = window;
    SweepOrder order(&index, ro, 0);
    // A unit of randomized position a is never delivered after one of position >= a + W.
    uint64_t max_pos = 0;
    bool any = false;
    std::set<uint64_t> positions_seen;
    for (uint64_t s = 0; s < order.num_segments(); ++s) {
      for (const Unit& u : order.Segment(s)) {
        if (any) {
          ASSERT_LT(max_pos, u.position + window) << "seed " << seed;
        }
        max_pos = std::max<uint64_t>(max_pos, u.position);
        any = true;
        // ... and only lands in segments [position, position + W).
        ASSERT_GE(s, u.position);
        ASSERT_LT(s, std::max<uint64_t>(u.position + window, order.num_segments()));
      }
    }
  }
}

TEST(Randomizer, WindowOfOneKeepsChunksTogether) {
  Index index = MakeIndex(100, 2, 10, 2);
  RandomizerOptions ro;
  ro.randomize = true;
  ro.seed = 4;
  ro.window = 1;
  SweepOrder order(&index, ro, 0);
  for (uint64_t s = 0; s < order.num_segments(); ++s) {
    std::set<uint32_t> chunks;
    for (const Unit& u : order.Segment(s)) chunks.insert(u.chunk);
    EXPECT_EQ(chunks.size(), 1u);
    EXPECT_EQ(*chunks.begin(), order.chunk_at(s));
  }
}

TEST(Randomizer, SampleBasedWindowKeepsUnitsWithinRSamples) {
  Index index = MakeIndex(300, 6, 5, 9);
  RandomizerOptions ro;
  ro.randomize = true;
  ro.seed = 2;
  ro.sample_window = true;
  ro.window = 40;
  SweepOrder order(&index, ro, 0);
  std::vector<uint64_t> base(order.num_segments() + 1, 0);
  for (uint64_t i = 0; i < order.num_segments(); ++i) base[i + 1] = base[i] + index.chunks[order.chunk_at(i)].num_samples;
  uint64_t count = 0;
  for (uint64_t s = 0; s < order.num_segments(); ++s) {
    for (const Unit& u : order.Segment(s)) {
      ++count;
      // Delivered in a segment whose start lies within R samples after its chunk's start.
      ASSERT_LT(base[s], base[u.position] + 40);
    }
  }
  EXPECT_EQ(count, 300u);
}

void SeekToAnySegment(uint64_t window) {
  Index index = MakeIndex(300, 3, 4, 5);
  RandomizerOptions ro;
  ro.randomize = true;
  ro.seed = 8;
  ro.window = window;
  SweepOrder full(&index, ro, 2);
  std::vector<std::vector<uint64_t>> segments;
  for (uint64_t s = 0; s < full.num_segments(); ++s) {
    std::vector<uint64_t> seqs;
    for (const Unit& u : full.Segment(s)) seqs.push_back(u.sequence);
    segments.push_back(seqs);
  }
  for (uint64_t start = 0; start < full.num_segments(); ++start) {
    SweepOrder seek(&index, ro, 2);
    for (uint64_t s = start; s < full.num_segments(); ++s) {
      std::vector<uint64_t> seqs;
      for (const Unit& u : seek.Segment(s)) seqs.push_back(u.sequence);
      ASSERT_EQ(seqs, segments[s]) << "start " << start << " segment " << s;
    }
  }
}

TEST(Randomizer, SeekToAnySegmentGivesTheSameUnits) {
  // Windows of 6 chunks and of 2000 (wider than the bucket table of DistributeByTable: the
  // general path); both start a seek with the segments before it dropped.
  for (uint64_t window : {6u, 2000u}) {
    SCOPED_TRACE(window);
    SeekToAnySegment(window);
  }
}

// The order of docs/randomization.md steps 1-3 computed the plain way: every unit of the
// sweep keyed with 128-bit arithmetic, one comparison sort by (key, sequence, frame).
std::vector<Unit> ReferenceSweep(const Index& index, const RandomizerOptions& ro, uint64_t sweep) {
  auto splitmix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const std::vector<uint32_t> order = ChunkOrder(index.chunks.size(), ro, sweep);
  std::vector<std::pair<unsigned __int128, Unit>> keyed;
  uint64_t base = 0;
  for (uint64_t p = 0; p < order.size(); ++p) {
    const ChunkEntry& c = index.chunks[order[p]];
    for (uint64_t s = c.first_sequence; s < c.first_sequence + c.num_sequences; ++s) {
      const uint32_t frames = ro.frame_mode ? index.sequences[s].num_samples : 1;
      for (uint32_t f = 0; f < frames; ++f) {
        const uint64_t h = splitmix((ro.seed + sweep) ^ splitmix((s << 24) ^ f)) >> 32;
        Unit u;
        u.sequence = s;
        u.frame = ro.frame_mode ? f : Unit::kWholeSequence;
        keyed.push_back({(static_cast<unsigned __int128>(base) << 32) + static_cast<unsigned __int128>(ro.window) * h, u});
      }
    }
    base += ro.sample_window ? c.num_samples : 1;
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) {
    if (x.first != y.first) return x.first < y.first;
    if (x.second.sequence != y.second.sequence) return x.second.sequence < y.second.sequence;
    return x.second.frame < y.second.frame;
  });
  std::vector<Unit> out;
  for (const auto& k : keyed) out.push_back(k.second);
  return out;
}

// Segments are sorted by a radix sort of their keys relative to the segment (falling back to
// full keys when those pass 64 bits): together they must be the one global order.
TEST(Randomizer, SegmentsConcatenateToTheGlobalKeyOrder) {
  struct Case {
    bool sample_window, frame_mode;
    uint64_t window;
  };
  // Sweep `sweep` of `index` under `k` through SweepOrder, against ReferenceSweep(); returns the
  // largest segment's size.
  auto expect_global_order = [](const Index& index, const Case& k, uint64_t seed, uint64_t sweep) -> size_t {
    RandomizerOptions ro;
    ro.randomize = true;
    ro.seed = seed;
    ro.sample_window = k.sample_window;
    ro.frame_mode = k.frame_mode;
    ro.window = k.window;
    const std::vector<Unit> want = ReferenceSweep(index, ro, sweep);
    SweepOrder order(&index, ro, sweep);
    std::vector<Unit> got;
    size_t largest = 0;
    for (uint64_t s = 0; s < order.num_segments(); ++s) {
      const HugeVector<Unit>& segment = order.Segment(s);
      largest = std::max(largest, segment.size());
      got.insert(got.end(), segment.begin(), segment.end());
    }
    EXPECT_EQ(got.size(), want.size()) << "window " << k.window << " seed " << seed;
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      if (got[i].sequence != want[i].sequence || got[i].frame != want[i].frame) {
        ADD_FAILURE() << "window " << k.window << " seed " << seed << " at " << i << ": sequence "
                      << got[i].sequence << " frame " << got[i].frame << ", expected sequence " << want[i].sequence
                      << " frame " << want[i].frame;
        break;
      }
    }
    return largest;
  };
  const Case cases[] = {
      // chunk windows, past the sweep; up to 1024 chunks their units are distributed through a
      // table of buckets (SweepOrder::DistributeByTable), wider ones as sample windows are
      {false, false, 1},  {false, false, 3},   {false, false, 1000}, {false, false, 1024}, {false, false, 1025},
      {false, true, 1025},
      {true, false, 150}, {true, false, 5000}, {true, false, uint64_t{1} << 40},  // 2^40: keys past 64 bits
      {false, true, 2},   {true, true, 700},   {true, true, uint64_t{1} << 33},
  };
  for (const Case& k : cases) {
    for (uint64_t seed : {0u, 7u}) {
      expect_global_order(MakeIndex(3000, 4, 300, seed), k, seed, 1);  // ~10 chunks, segments of hundreds of units
    }
  }
  // Segments of more than 65536 units (sorted in runs): 70000 sequences in 4 chunks under a
  // whole-sweep window, as sequences (70000 units in the last segment), as frames, and under
  // a sample window.
  const Index big = MakeIndex(70000, 4, 20000, 5);
  for (const Case& k : {Case{false, false, 1000}, Case{false, true, 1000}, Case{true, false, uint64_t{1} << 20}}) {
    EXPECT_GT(expect_global_order(big, k, 5, 2), 65536u) << "window " << k.window;  // the runs' path was taken
  }
}

// Equal keys are rare in a real sweep; in the first two kinds of keys here most repeat, over
// several key bytes (up to the top one); the last two are random over many widths, so that
// every digit of the radix sort orders something. Segments of more than 65536 units are
// first split into runs by their keys' top bits (runs of one key value, or all keys in one
// run, in the first two kinds).
TEST(Randomizer, SortSegmentBreaksEqualKeysBySequenceThenFrame) {
  std::mt19937_64 rng(3);
  for (int kind = 0; kind < 4; ++kind) {
    for (size_t n : {0u, 1u, 5u, 64u, 65u, 1000u, 5000u, 20000u, 65537u, 200000u}) {
      std::vector<uint64_t> keys(n);
      std::vector<Unit> units(n);
      for (size_t i = 0; i < n; ++i) {
        switch (kind) {
          case 0: keys[i] = (rng() % 5) << (8 * (rng() % 6)); break;  // 5 values at 6 byte positions
          case 1: keys[i] = (rng() % 5) << (8 * (rng() % 8)); break;  // ... at 8
          case 2: keys[i] = rng() >> (16 + rng() % 48); break;        // under 2^48
          default: keys[i] = rng() >> (rng() % 64); break;            // any width
        }
        units[i].sequence = rng() % 50;
        units[i].frame = static_cast<uint32_t>(i);  // (sequence, frame) unique
      }
      std::vector<size_t> want(n);
      std::iota(want.begin(), want.end(), size_t{0});
      std::sort(want.begin(), want.end(), [&](size_t x, size_t y) {
        if (keys[x] != keys[y]) return keys[x] < keys[y];
        if (units[x].sequence != units[y].sequence) return units[x].sequence < units[y].sequence;
        return units[x].frame < units[y].frame;
      });
      HugeVector<Unit> got(1);  // appended after what is there
      SortSegment(keys, units, &got);
      ASSERT_EQ(got.size(), n + 1);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i + 1].sequence, units[want[i]].sequence) << "kind " << kind << " n " << n << " at " << i;
        ASSERT_EQ(got[i + 1].frame, units[want[i]].frame) << "kind " << kind << " n " << n << " at " << i;
      }
    }
  }
}

TEST(Distributed, RanksAreDisjointCompleteAndEquallyLong) {
  for (uint32_t world : {1u, 2u, 3u, 5u, 8u, 40u}) {  // 40 > the chunk count
    Index index = MakeIndex(250, 4, 13, world);
    std::vector<uint64_t> all;
    std::vector<size_t> batch_counts;
    std::vector<std::vector<uint64_t>> global_sizes(world);
    for (uint32_t r = 0; r < world; ++r) {
      PlannerOptions o = Randomized(3, 4, 40);
      o.epochs = 2;
      o.rank = r;
      o.world = world;
      auto p = Planner::Create(&index, o);
      ASSERT_TRUE(p.ok());
      std::vector<PlannedBatch> batches;
      auto d = RunPlanner(p->get(), &batches);
      batch_counts.push_back(batches.size());
      for (const auto& b : batches) global_sizes[r].push_back(b.global_samples);
      for (const auto& x : d)
        if (x.epoch == 1) all.push_back(x.sequence);
    }
    for (uint32_t r = 1; r < world; ++r) {
      EXPECT_EQ(batch_counts[r], batch_counts[0]) << "world " << world;
      EXPECT_EQ(global_sizes[r], global_sizes[0]) << "all ranks walk one timeline";
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 250u) << "world " << world;
    for (uint64_t i = 0; i < 250; ++i) ASSERT_EQ(all[i], i);
  }
}

// Resuming from the cursor after every batch boundary gives exactly the remainder.
void CheckResumeEverywhere(const Index& index, const PlannerOptions& o) {
  auto p = Planner::Create(&index, o);
  ASSERT_TRUE(p.ok());
  std::vector<PlannedBatch> batches;
  RunPlanner(p->get(), &batches);
  for (size_t k = 0; k < batches.size(); ++k) {
    Cursor c;
    c.state = batches[k].after;
    auto decoded = DecodeCursor(EncodeCursor(c));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_TRUE(decoded->state == batches[k].after);
    auto q = Planner::Create(&index, o);
    auto seek_status = (*q)->Resume(decoded->state);  // as a resume does: checked first
    ASSERT_TRUE(seek_status.ok()) << seek_status << " after batch " << k;
    for (size_t j = k + 1; j < batches.size(); ++j) {
      auto b = (*q)->Next();
      ASSERT_TRUE(b.has_value()) << "resume after " << k << " ended early at " << j;
      ASSERT_EQ(b->epoch, batches[j].epoch);
      ASSERT_EQ(b->batch, batches[j].batch);
      ASSERT_EQ(b->pieces.size(), batches[j].pieces.size());
      for (size_t i = 0; i < b->pieces.size(); ++i) {
        ASSERT_EQ(b->pieces[i].sequence, batches[j].pieces[i].sequence);
        ASSERT_EQ(b->pieces[i].sample_begin, batches[j].pieces[i].sample_begin);
        ASSERT_EQ(b->pieces[i].row, batches[j].pieces[i].row);
      }
      ASSERT_TRUE(b->after == batches[j].after);
    }
    ASSERT_FALSE((*q)->Next().has_value());
  }
}

TEST(Resume, FromEveryBatchBoundaryRandomized) {
  Index index = MakeIndex(120, 4, 9, 1);
  PlannerOptions o = Randomized(5, 3, 11);
  o.epochs = 3;
  o.epoch_size = 170;  // epochs cut across sweeps
  CheckResumeEverywhere(index, o);
}

TEST(Resume, FromEveryBatchBoundaryFileOrderRankedFrameMode) {
  Index index = MakeIndex(60, 4, 5, 2);
  PlannerOptions o;
  o.minibatch_size = 7;
  o.epochs = 2;
  o.rank = 1;
  o.world = 3;
  o.randomizer.frame_mode = true;
  CheckResumeEverywhere(index, o);
}

TEST(Resume, FromEveryBatchBoundaryTruncated) {
  Index index = MakeIndex(50, 9, 4, 3);
  PlannerOptions o = Randomized(1, 2, 12);
  o.truncation = 4;
  o.parallel = 3;
  o.epochs = 2;
  CheckResumeEverywhere(index, o);
}

TEST(Resume, FromEveryBatchBoundaryFullMinibatchesAndSequences) {
  Index index = MakeIndex(90, 3, 7, 4);  // sequences of several samples
  PlannerOptions o = Randomized(3, 2, 13);
  o.epochs = 4;
  o.full_minibatches = true;  // minibatches that run past their epoch's end
  o.epoch_size = 101;
  CheckResumeEverywhere(index, o);
  o.full_minibatches = false;
  CheckResumeEverywhere(index, o);
  // Epochs shorter than a sequence (1-13 samples), and full minibatches larger than an epoch:
  // cursors whose place lies past their epoch's nominal end (review).
  Index longer = MakeIndex(60, 13, 5, 4);
  for (uint64_t epoch_size : {3u, 5u, 40u}) {
    for (bool full : {false, true}) {
      for (uint32_t world : {1u, 3u}) {
        PlannerOptions q = Randomized(3, 2, 16);
        q.epochs = 3;
        q.epoch_size = epoch_size;
        q.full_minibatches = full;
        q.world = world;
        q.rank = world - 1;
        SCOPED_TRACE(::testing::Message() << "epoch size " << epoch_size << " full " << full << " world " << world);
        CheckResumeEverywhere(longer, q);
      }
    }
  }
}

// A cursor is checked, not signed: one edited so that its epoch, batch number and place on
// the timeline disagree is refused (it would label batches wrongly or wrap their numbers).
TEST(Resume, ACursorThatDisagreesWithItselfIsRefused) {
  Index index = MakeIndex(120, 4, 9, 1);
  PlannerOptions o = Randomized(5, 3, 11);
  o.epochs = 3;
  auto p = Planner::Create(&index, o);
  std::vector<PlannedBatch> batches;
  RunPlanner(p->get(), &batches);
  ASSERT_GT(batches.size(), 3u);
  const CursorState good = batches[2].after;  // epoch 0, batch 3
  auto resume = [&](const CursorState& s) {
    auto q = Planner::Create(&index, o);
    return (*q)->Resume(s);
  };
  EXPECT_TRUE(resume(good).ok());
  CursorState s = good;
  s.epoch = 2;  // sweep 0's place labelled epoch 2
  EXPECT_EQ(resume(s).code(), absl::StatusCode::kInvalidArgument);
  s = good;
  s.batch = UINT64_MAX;  // more batches than samples before it
  EXPECT_EQ(resume(s).code(), absl::StatusCode::kInvalidArgument);
  s = good;
  s.sweep = UINT64_MAX;
  EXPECT_EQ(resume(s).code(), absl::StatusCode::kInvalidArgument);
  s = good;
  s.epoch = 4;
  EXPECT_EQ(resume(s).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Resume, ElasticResumeDeliversTheRemainderExactlyOnce) {
  Index index = MakeIndex(300, 3, 7, 4);
  for (uint32_t new_world : {1u, 3u, 4u}) {
    for (size_t stop : {0u, 3u, 10u}) {
      std::multiset<uint64_t> delivered;
      CursorState at;
      for (uint32_t r = 0; r < 2; ++r) {  // old world 2 reads `stop` + 1 batches
        PlannerOptions o = Randomized(6, 5, 50);
        o.rank = r;
        o.world = 2;
        auto p = Planner::Create(&index, o);
        for (size_t k = 0; k <= stop; ++k) {
          auto b = (*p)->Next();
          ASSERT_TRUE(b.has_value());
          for (const Piece& piece : b->pieces) delivered.insert(piece.sequence);
          at = b->after;
        }
      }
      for (uint32_t r = 0; r < new_world; ++r) {
        PlannerOptions o = Randomized(6, 5, 50);
        o.rank = r;
        o.world = new_world;
        auto p = Planner::Create(&index, o);
        ASSERT_TRUE((*p)->Seek(at).ok());
        for (const auto& d : RunPlanner(p->get())) delivered.insert(d.sequence);
      }
      ASSERT_EQ(delivered.size(), 300u) << "new world " << new_world << " stop " << stop;
      for (uint64_t i = 0; i < 300; ++i) ASSERT_EQ(delivered.count(i), 1u) << i;
    }
  }
}

TEST(FrameMode, EverySampleOnceRandomizedAcrossSequences) {
  Index index = MakeIndex(80, 6, 5, 7);
  PlannerOptions o = Randomized(2, 4, 16);
  o.randomizer.frame_mode = true;
  auto p = Planner::Create(&index, o);
  auto d = RunPlanner(p->get());
  std::set<std::pair<uint64_t, uint32_t>> frames;
  bool interleaved = false;
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].sample_count, 1u);
    frames.insert({d[i].sequence, d[i].frame});
    if (i > 0 && d[i].sequence != d[i - 1].sequence && i + 1 < d.size() && d[i + 1].sequence == d[i - 1].sequence)
      interleaved = true;
  }
  EXPECT_EQ(frames.size(), index.total_samples);
  EXPECT_EQ(d.size(), index.total_samples);
  EXPECT_TRUE(interleaved) << "frames of one sequence should mix with others";
}

TEST(Truncated, SlotsCarrySequencesContiguouslyAcrossMinibatches) {
  Index index = MakeIndex(40, 9, 4, 8);
  PlannerOptions o = Randomized(3, 2, 12);
  o.truncation = 5;
  o.parallel = 3;
  auto p = Planner::Create(&index, o);
  std::vector<PlannedBatch> batches;
  RunPlanner(p->get(), &batches);
  std::map<uint64_t, uint32_t> next_sample;  // sequence -> next expected sample
  std::map<uint64_t, uint32_t> slot_of;
  for (const auto& b : batches) {
    EXPECT_EQ(b.steps, 5u);
    EXPECT_EQ(b.rows, 3u);
    for (const Piece& piece : b.pieces) {
      EXPECT_LE(piece.t0 + piece.sample_count, 5u);
      EXPECT_EQ(piece.sample_begin, next_sample[piece.sequence]);
      EXPECT_EQ(piece.begins, piece.sample_begin == 0);
      if (slot_of.count(piece.sequence)) {
        EXPECT_EQ(slot_of[piece.sequence], piece.row);
      }
      slot_of[piece.sequence] = piece.row;
      next_sample[piece.sequence] += piece.sample_count;
      EXPECT_EQ(piece.ends, next_sample[piece.sequence] == index.sequences[piece.sequence].num_samples);
    }
  }
  ASSERT_EQ(next_sample.size(), 40u);
  for (const auto& [seq, n] : next_sample) EXPECT_EQ(n, index.sequences[seq].num_samples);
}

TEST(Planner, RefusesFrameModeWithTruncationAndBadRanks) {
  Index index = MakeIndex(10, 2, 2, 0);
  PlannerOptions o;
  o.randomizer.frame_mode = true;
  o.truncation = 3;
  EXPECT_FALSE(Planner::Create(&index, o).ok());
  PlannerOptions r;
  r.rank = 2;
  r.world = 2;
  EXPECT_FALSE(Planner::Create(&index, r).ok());
}

TEST(Cursor, RefusesCorruptAndForeignTokens) {
  Cursor c;
  c.data_hash = 1;
  c.config_hash = 2;
  c.seed = 3;
  c.world = 4;
  c.rank = 2;
  c.state.epoch = 5;
  c.state.slots.resize(2);
  c.state.slots[1].active = true;
  c.state.slots[1].sequence = 9;
  c.state.slots[1].offset = 4;
  const std::string token = EncodeCursor(c);
  auto ok = DecodeCursor(token);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->state == c.state);
  EXPECT_EQ(ok->rank, 2u);
  for (size_t i = 4; i < token.size(); ++i) {
    std::string t = token;
    t[i] = t[i] == 'x' ? 'y' : 'x';
    EXPECT_FALSE(DecodeCursor(t).ok()) << i;
  }
  EXPECT_FALSE(DecodeCursor(token.substr(0, token.size() - 3)).ok());
  EXPECT_FALSE(DecodeCursor("hello").ok());
  EXPECT_FALSE(DecodeCursor("cv2.AAAA").ok());
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

TEST(MinibatchMode, FullFillsTheLastMinibatchAndLosesNothing) {
  Index index = MakeIndex(100, 1, 10, 1);  // 100 one-sample sequences
  PlannerOptions o = Randomized(2, 3, 30);
  o.epochs = 3;
  o.full_minibatches = true;
  auto p = Planner::Create(&index, o);
  std::vector<PlannedBatch> batches;
  auto d = RunPlanner(p->get(), &batches);
  for (const auto& b : batches) EXPECT_EQ(b.global_samples, 30u);  // every minibatch is full
  EXPECT_EQ(batches.size(), 10u);  // 300 samples / 30 (epochs: 4, 3, 3 minibatches)
  std::map<uint64_t, int> seen;
  for (const auto& x : d) ++seen[x.sequence];
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(seen[i], 3) << i;  // each once per sweep
  PlannerOptions partial = Randomized(2, 3, 30);
  auto q = Planner::Create(&index, partial);
  std::vector<PlannedBatch> pb;
  RunPlanner(q->get(), &pb);
  EXPECT_EQ(pb.back().global_samples, 10u);  // 100 = 3 x 30 + 10
}

}  // namespace
}  // namespace conveyor
