// How ranks share a global minibatch (the balanced and chunks distributions), starting at an
// epoch (Planner::SeekEpoch), and DataLoader workers sharing one rank's stream by batch
// (LoaderOptions::batch_stride/offset). Planner-level cases over generated indexes; the
// stride case runs the loader over a real CTF file.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/batch/assembler.h"
#include "common/dataset/dataset.h"
#include "common/sampling/loader.h"
#include "common/sampling/planner.h"
#include "gtest/gtest.h"
#include "tests/common/sampling/planner_test_util.h"
#include "common/sampling/cursor.h"
#include "tests/test_util.h"

namespace conveyor {
namespace {

PlannerOptions Options(Distribution d, uint32_t rank, uint32_t world, uint64_t mb, uint64_t epochs = 1) {
  PlannerOptions o;
  o.minibatch_size = mb;
  o.randomizer.randomize = true;
  o.randomizer.seed = 9;
  o.randomizer.window = 40;
  o.distribution = d;
  o.rank = rank;
  o.world = world;
  o.epochs = epochs;
  return o;
}

struct Local {
  uint64_t epoch, batch, samples, sequences;
  std::vector<uint64_t> seqs;
};

std::vector<Local> PlanAll(Planner* p, const Index& index) {
  std::vector<Local> out;
  while (auto b = p->Next()) {
    Local l{b->epoch, b->batch, 0, b->pieces.size(), {}};
    for (const Piece& piece : b->pieces) {
      l.samples += piece.sample_count == Piece::kAll ? index.sequences[piece.sequence].num_samples : piece.sample_count;
      l.seqs.push_back(piece.sequence);
    }
    out.push_back(std::move(l));
  }
  return out;
}

// Every rank's local minibatch is within one sequence of minibatch/world; none is empty
// while the global one has at least `world` sequences; ranks are disjoint, complete, and
// have the same number of batches.
TEST(Balanced, EvenDisjointCompleteAndInStep) {
  for (uint32_t max_len : {1u, 4u}) {
    Index index = MakeIndex(997, max_len, 23, 5 + max_len);
    for (uint32_t world : {1u, 2u, 3u, 4u, 7u}) {
      for (uint64_t mb : {28u, 64u}) {
        SCOPED_TRACE(::testing::Message() << "max_len " << max_len << " world " << world << " mb " << mb);
        std::vector<std::vector<Local>> ranks;
        for (uint32_t r = 0; r < world; ++r) {
          auto p = Planner::Create(&index, Options(Distribution::kBalanced, r, world, mb));
          ASSERT_TRUE(p.ok()) << p.status();
          ranks.push_back(PlanAll(p->get(), index));
        }
        std::multiset<uint64_t> all;
        for (uint32_t r = 0; r < world; ++r) {
          ASSERT_EQ(ranks[r].size(), ranks[0].size());
          for (const Local& l : ranks[r]) all.insert(l.seqs.begin(), l.seqs.end());
        }
        ASSERT_EQ(all.size(), index.sequences.size());
        for (uint64_t s = 0; s < index.sequences.size(); ++s) ASSERT_EQ(all.count(s), 1u) << s;
        for (size_t k = 0; k < ranks[0].size(); ++k) {
          uint64_t lo = ~uint64_t{0}, hi = 0, global_sequences = 0;
          for (uint32_t r = 0; r < world; ++r) {
            ASSERT_EQ(ranks[r][k].batch, k);
            lo = std::min(lo, ranks[r][k].samples);
            hi = std::max(hi, ranks[r][k].samples);
            global_sequences += ranks[r][k].sequences;
          }
          const bool last = k + 1 == ranks[0].size();
          if (!last) {
            // The target is mb/world; a rank passes it by less than one sequence.
            EXPECT_LE(hi - lo, max_len) << "batch " << k;
            EXPECT_LE(hi, mb / world + max_len) << "batch " << k;
          }
          if (global_sequences >= world) {
            for (uint32_t r = 0; r < world; ++r) EXPECT_GT(ranks[r][k].sequences, 0u) << "rank " << r << " batch " << k;
          }
        }
      }
    }
  }
}

// The chunks distribution (CNTK's): a rank takes whole chunks, so local batches vary; still
// disjoint and complete.
TEST(Chunks, DisjointCompleteButUneven) {
  Index index = MakeIndex(600, 1, 50, 3);
  const uint32_t world = 4;
  std::multiset<uint64_t> all;
  uint64_t spread = 0;
  std::vector<std::vector<Local>> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    auto p = Planner::Create(&index, Options(Distribution::kChunks, r, world, 40));
    ASSERT_TRUE(p.ok());
    ranks.push_back(PlanAll(p->get(), index));
    for (const Local& l : ranks.back()) all.insert(l.seqs.begin(), l.seqs.end());
  }
  ASSERT_EQ(all.size(), 600u);
  EXPECT_EQ(std::set<uint64_t>(all.begin(), all.end()).size(), 600u);
  for (size_t k = 0; k + 1 < ranks[0].size(); ++k) {
    uint64_t lo = ~uint64_t{0}, hi = 0;
    for (uint32_t r = 0; r < world; ++r) {
      lo = std::min(lo, ranks[r][k].samples);
      hi = std::max(hi, ranks[r][k].samples);
    }
    spread = std::max(spread, hi - lo);
  }
  EXPECT_GT(spread, 5u);  // whole chunks of 50: ranks' shares differ
}

// Balanced positions are global: a cursor taken in a world of 2 continues in a world of 3
// or 5 with every sequence of the epoch delivered exactly once.
TEST(Balanced, ElasticResumeDeliversTheRemainderOnce) {
  Index index = MakeIndex(500, 3, 20, 11);
  for (uint32_t new_world : {1u, 3u, 5u}) {
    for (size_t stop : {0u, 4u, 9u}) {
      std::multiset<uint64_t> delivered;
      CursorState at;
      for (uint32_t r = 0; r < 2; ++r) {
        auto p = Planner::Create(&index, Options(Distribution::kBalanced, r, 2, 30));
        ASSERT_TRUE(p.ok());
        for (size_t k = 0; k <= stop; ++k) {
          auto b = (*p)->Next();
          ASSERT_TRUE(b.has_value());
          for (const Piece& piece : b->pieces) delivered.insert(piece.sequence);
          at = b->after;
        }
      }
      for (uint32_t r = 0; r < new_world; ++r) {
        auto p = Planner::Create(&index, Options(Distribution::kBalanced, r, new_world, 30));
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE((*p)->Seek(at).ok());
        for (const Local& l : PlanAll(p->get(), index)) delivered.insert(l.seqs.begin(), l.seqs.end());
      }
      ASSERT_EQ(delivered.size(), 500u) << "new world " << new_world << " stop " << stop;
      for (uint64_t s = 0; s < 500; ++s) ASSERT_EQ(delivered.count(s), 1u) << s;
    }
  }
}

// SeekEpoch(e) gives exactly the batches of epoch e that planning from epoch 0 gives.
TEST(SeekEpoch, EqualsTheEpochOfAFullRun) {
  Index index = MakeIndex(300, 3, 17, 2);
  for (Distribution d : {Distribution::kBalanced, Distribution::kChunks}) {
    for (uint32_t world : {1u, 3u}) {
      for (uint32_t r = 0; r < world; ++r) {
        auto full = Planner::Create(&index, Options(d, r, world, 25, 4));
        ASSERT_TRUE(full.ok());
        std::vector<Local> all = PlanAll(full->get(), index);
        for (uint64_t e : {1u, 3u}) {
          auto p = Planner::Create(&index, Options(d, r, world, 25, e + 1));
          ASSERT_TRUE(p.ok());
          ASSERT_TRUE((*p)->SeekEpoch(e).ok());
          std::vector<Local> got = PlanAll(p->get(), index);
          std::vector<Local> want;
          for (const Local& l : all) if (l.epoch == e) want.push_back(l);
          ASSERT_EQ(got.size(), want.size()) << "epoch " << e;
          ASSERT_FALSE(got.empty());
          for (size_t k = 0; k < got.size(); ++k) {
            EXPECT_EQ(got[k].epoch, e);
            EXPECT_EQ(got[k].batch, want[k].batch);
            EXPECT_EQ(got[k].seqs, want[k].seqs) << "epoch " << e << " batch " << k;
          }
        }
        auto bad = Planner::Create(&index, Options(d, r, world, 25, 2));
        EXPECT_FALSE((*bad)->SeekEpoch(2).ok());  // past the epochs planned
      }
    }
  }
}

}  // namespace
}  // namespace conveyor

namespace conveyor::testing {
namespace {

// Workers w of W of one rank (batch_stride W, batch_offset w) deliver, interleaved in
// stream order, exactly the stream of a single loader: same batches, same bytes, same
// cursors; each parses only what its own batches need.
TEST(BatchStride, WorkersTogetherAreTheStream) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 3000; ++i) data += std::to_string(i) + " |a " + std::to_string(i * 3) + " " + std::to_string(i) + "\n";
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 2, format: dense}}", "randomize: true\n    randomizationWindow: 500");
  c.deserializers[0].chunk_size_in_bytes = 2000;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 64;
  lo.planner.randomizer.randomize = true;
  lo.planner.randomizer.seed = 4;
  lo.planner.randomizer.window = 500;
  lo.planner.epochs = 2;
  lo.planner.distribution = Distribution::kBalanced;
  lo.planner.world = 2;
  lo.planner.rank = 1;
  struct Got {
    uint64_t epoch, index;
    std::string bytes;
    CursorState after;
  };
  auto collect = [&](LoaderOptions o) {
    std::vector<Got> out;
    auto l = Loader::Create(ds->get(), cpu.get(), o);
    EXPECT_TRUE(l.ok()) << l.status();
    Batch b;
    while (true) {
      auto more = (*l)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      out.push_back({b.epoch, b.index, std::string(reinterpret_cast<const char*>(b.bytes.data()), b.bytes.size()), b.after});
    }
    return out;
  };
  const std::vector<Got> whole = collect(lo);
  ASSERT_GT(whole.size(), 40u);
  for (uint32_t workers : {2u, 3u}) {
    std::vector<std::vector<Got>> per(workers);
    for (uint32_t w = 0; w < workers; ++w) {
      LoaderOptions o = lo;
      o.batch_stride = workers;
      o.batch_offset = w;
      per[w] = collect(o);
    }
    for (size_t k = 0; k < whole.size(); ++k) {
      const std::vector<Got>& mine = per[k % workers];
      ASSERT_LT(k / workers, mine.size()) << "workers " << workers << " batch " << k;
      const Got& g = mine[k / workers];
      EXPECT_EQ(g.epoch, whole[k].epoch);
      EXPECT_EQ(g.index, whole[k].index);
      EXPECT_EQ(g.bytes, whole[k].bytes) << "workers " << workers << " batch " << k;
      EXPECT_EQ(EncodeCursor(Cursor{0, 0, 0, 1, 2, g.after}), EncodeCursor(Cursor{0, 0, 0, 1, 2, whole[k].after}));
    }
    size_t total = 0;
    for (const auto& p : per) total += p.size();
    EXPECT_EQ(total, whole.size());
  }
  // first_epoch: the second epoch alone, as the whole run has it.
  LoaderOptions second = lo;
  second.first_epoch = 1;
  std::vector<Got> e1 = collect(second);
  std::vector<Got> want;
  for (const Got& g : whole) if (g.epoch == 1) want.push_back(g);
  ASSERT_EQ(e1.size(), want.size());
  for (size_t k = 0; k < e1.size(); ++k) EXPECT_EQ(e1[k].bytes, want[k].bytes) << k;
}

}  // namespace
}  // namespace conveyor::testing
