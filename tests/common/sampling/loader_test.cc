// The file-order planner and the loader: minibatch cutting, epochs across sweeps, the
// parse-ahead pipeline and keepDataInMemory.
#include <string>

#include "common/formats/ctf/ctf_indexer.h"
#include "common/sampling/loader.h"
#include "common/sampling/planner.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

Index MakeIndex(const std::vector<uint32_t>& lengths, uint64_t chunk_size) {
  Index index;
  uint64_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    index.sequences.push_back({i, offset, i, 10, lengths[i]});
    offset += 10;
  }
  index.BuildChunks(chunk_size);
  return index;
}

std::vector<std::vector<uint64_t>> Plan(const Index& index, PlannerOptions o) {
  auto planner = Planner::Create(&index, o);
  EXPECT_TRUE(planner.ok());
  std::vector<std::vector<uint64_t>> out;
  while (auto b = (*planner)->Next()) {
    std::vector<uint64_t> seqs;
    for (const auto& s : b->pieces) seqs.push_back(s.sequence);
    out.push_back(seqs);
  }
  return out;
}

TEST(Planner, TakesWholeSequencesUpToTheMinibatchSize) {
  Index index = MakeIndex({3, 2, 4, 1, 5}, 1000);
  PlannerOptions o;
  o.minibatch_size = 5;
  // 3+2 | 4+1 | 5
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2, 3}, {4}}));
}

TEST(Planner, ALongerSequenceGoesAlone) {
  Index index = MakeIndex({1, 9, 1}, 1000);
  PlannerOptions o;
  o.minibatch_size = 4;
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0}, {1}, {2}}));
}

TEST(Planner, EpochSizeCutsAcrossSweeps) {
  // 5 one-sample sequences; epochs of 3 samples: [0,1,2] [3,4 | 0] [1,2,3] ...
  Index index = MakeIndex({1, 1, 1, 1, 1}, 1000);
  PlannerOptions o;
  o.minibatch_size = 2;
  o.epochs = 3;
  o.epoch_size = 3;
  // Sweep end cuts a minibatch (CNTK's V1 behaviour).
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2}, {3, 4}, {0}, {1, 2}, {3}}));
}

TEST(Planner, EpochStartsAtTheFirstSequenceAtOrAfterItsOffset) {
  // Lengths 2,2,2: epoch size 3 -> epoch 1 starts at sample 3, i.e. sequence 2 (starts at 4).
  Index index = MakeIndex({2, 2, 2}, 1000);
  PlannerOptions o;
  o.minibatch_size = 100;
  o.epochs = 2;
  o.epoch_size = 3;
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2}}));
}

TEST(Planner, RefusesZeroMinibatch) {
  Index index = MakeIndex({1}, 10);
  PlannerOptions o;
  o.minibatch_size = 0;
  EXPECT_FALSE(Planner::Create(&index, o).ok());
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string data;
    for (int i = 0; i < 400; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
    file_ = dir_.Write("d.ctf", data);
  }
  uint64_t ParsedAfterEpochs(bool keep, uint64_t epochs, int threads) {
    DatasetConfig c = CtfDataset(file_, "{a: {dim: 1, format: dense}}");
    c.keep_data_in_memory = keep;
    c.deserializers[0].chunk_size_in_bytes = 500;
    auto ds = Dataset::Open(c);
    EXPECT_TRUE(ds.ok());
    auto cpu = MakeCpuAssembler();
    LoaderOptions lo;
    lo.planner.minibatch_size = 7;
    lo.planner.epochs = epochs;
    lo.planner.randomizer.randomize = true;
    lo.planner.randomizer.window = 3;
    lo.threads = threads;
    auto loader = Loader::Create(ds->get(), cpu.get(), lo);
    EXPECT_TRUE(loader.ok());
    Batch b;
    uint64_t samples = 0;
    while (true) {
      auto more = (*loader)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      samples += b.plan.num_samples;
    }
    EXPECT_EQ(samples, 400 * epochs);
    chunks_ = (*ds)->index().chunks.size();
    return (*loader)->pipeline().chunks_parsed();
  }
  TempDir dir_;
  std::string file_;
  uint64_t chunks_ = 0;
};

TEST_F(LoaderTest, KeepDataInMemoryParsesEachChunkOnce) {
  const uint64_t parsed = ParsedAfterEpochs(true, 3, 2);
  EXPECT_EQ(parsed, chunks_);
  EXPECT_GT(chunks_, 5u);
}

TEST_F(LoaderTest, WithoutKeepEveryEpochParsesAgain) {
  const uint64_t parsed = ParsedAfterEpochs(false, 3, 2);
  EXPECT_EQ(parsed, 3 * chunks_);
}

TEST_F(LoaderTest, ParseErrorBeyondTheBudgetStopsTheLoader) {
  DatasetConfig c = CtfDataset(dir_.Write("bad.ctf", "1 |a 1\n2 |a 2\n3 |a ?\n"), "{a: {dim: 1, format: dense}}");
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 1;
  auto loader = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(loader.ok());
  Batch b;
  auto first = (*loader)->Next(&b);
  ASSERT_FALSE(first.ok());  // the chunk holding all three fails as a whole
  EXPECT_NE(first.status().message().find("bad.ctf:3:6: unexpected '?'"), std::string::npos) << first.status();
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

TEST(SharedChunks, TwoReadersOfOneStreamParseEachChunkOnce) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 2000; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}}",
                               "randomize: true\n    randomizationWindow: 4");
  c.deserializers[0].chunk_size_in_bytes = 1000;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 32;
  lo.planner.randomizer.randomize = true;
  lo.planner.randomizer.window = 4;
  auto a = Loader::Create(ds->get(), cpu.get(), lo);
  auto b = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(a.ok() && b.ok());
  Batch x, y;
  uint64_t batches = 0;
  while (true) {  // in lockstep, as two workers of one job would be
    auto ma = (*a)->Next(&x);
    auto mb = (*b)->Next(&y);
    ASSERT_TRUE(ma.ok() && mb.ok());
    ASSERT_EQ(*ma, *mb);
    if (!*ma) break;
    ASSERT_EQ(x.plan.pieces.size(), y.plan.pieces.size());
    ++batches;
  }
  EXPECT_GT(batches, 50u);
  EXPECT_EQ((*ds)->parses(), (*ds)->index().chunks.size());
}

}  // namespace
}  // namespace conveyor::testing
