// The whole read path with randomization on real files: thread and prefetch settings do not
// change the order, ranks split the data, memory stays bounded by the window.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string MakeData(int sequences) {
  std::string data;
  for (int i = 0; i < sequences; ++i) {
    const int rows = 1 + i % 4;
    for (int r = 0; r < rows; ++r)
      data += std::to_string(i) + " |a " + std::to_string(i) + " " + std::to_string(r) + " |s " + std::to_string(i % 50) + ":1\n";
  }
  return data;
}

std::vector<std::string> Keys(const std::string& dump) {
  std::vector<std::string> keys;
  std::istringstream in(dump);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"key\":\"");
    if (at != std::string::npos) keys.push_back(line.substr(at + 7, line.find('"', at + 7) - at - 7));
  }
  return keys;
}

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = CtfDataset(dir_.Write("d.ctf", MakeData(3000)),
                         "{a: {dim: 2, format: dense}, s: {dim: 50, format: sparse}}",
                         "randomize: true\n    randomizationWindow: 3");
    config_.deserializers[0].chunk_size_in_bytes = 2000;
  }
  TempDir dir_;
  DatasetConfig config_;
};

TEST_F(StreamTest, ThreadsAndPrefetchDoNotChangeTheOrder) {
  ReadOptions base;
  base.minibatch_size = 64;
  base.epochs = 2;
  base.cursors = true;
  auto one = DumpDataset(config_, base);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(Keys(*one).size(), 6000u);
  for (int threads : {2, 3, 8}) {
    ReadOptions ro = base;
    ro.threads = threads;
    auto out = DumpDataset(config_, ro);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, *one) << threads << " threads";
  }
}

TEST_F(StreamTest, RandomizedEpochIsAPermutation) {
  ReadOptions ro;
  ro.minibatch_size = 50;
  auto out = DumpDataset(config_, ro);
  ASSERT_TRUE(out.ok());
  std::vector<std::string> keys = Keys(*out);
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end(), [](const std::string& a, const std::string& b) { return std::stoi(a) < std::stoi(b); });
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(sorted[i], std::to_string(i));
  EXPECT_NE(keys, sorted);
}

TEST_F(StreamTest, RanksThroughTheLoaderAreDisjointAndComplete) {
  std::multiset<std::string> all;
  size_t lines0 = 0;
  for (uint32_t r = 0; r < 3; ++r) {
    ReadOptions ro;
    ro.minibatch_size = 90;
    ro.cursors = true;
    ro.request.rank = r;
    ro.request.world = 3;
    auto out = DumpDataset(config_, ro);
    ASSERT_TRUE(out.ok()) << out.status();
    for (const auto& k : Keys(*out)) all.insert(k);
    // Every rank sees every batch (possibly empty), so cursors line up one per batch.
    size_t cursor_lines = 0;
    for (size_t p = 0; (p = out->find("\"cursor\":", p)) != std::string::npos; ++p) ++cursor_lines;
    if (r == 0) lines0 = cursor_lines;
    EXPECT_EQ(cursor_lines, lines0) << "rank " << r;
  }
  EXPECT_EQ(all.size(), 3000u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 3000u);
}

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST(StreamMemory, RssStaysFlatOnAFileTenTimesTheWindow) {
  if (kUnderAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine, so RSS cannot show the loader's footprint";
  }
  TempDir dir;
  std::string data;
  // ~48 MB of dense text in 1 MiB chunks; the window is 2 chunks: the file is 24x the window.
  std::string row = "|x";
  for (int j = 0; j < 64; ++j) row += " 0.123456";
  row += "\n";
  while (data.size() < (48u << 20)) data += row;
  DatasetConfig c = CtfDataset(dir.Write("big.ctf", data), "{x: {dim: 64, format: dense}}",
                               "randomize: true\n    randomizationWindow: 2");
  c.deserializers[0].chunk_size_in_bytes = 1 << 20;
  data.clear();
  data.shrink_to_fit();
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  ASSERT_GE((*ds)->index().chunks.size(), 40u);
  StreamRequest r;
  r.minibatch_size = 512;
  auto resolved = ResolveStream(**ds, r);
  ASSERT_TRUE(resolved.ok());
  auto cpu = MakeCpuAssembler();
  auto loader = Loader::Create(ds->get(), cpu.get(), resolved->loader);
  ASSERT_TRUE(loader.ok());
  Batch b;
  uint64_t batches = 0, baseline = 0, peak = 0;
  size_t max_open = 0;
  while (true) {
    auto more = (*loader)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    ++batches;
    max_open = std::max(max_open, (*loader)->open_chunks());
    if (batches == 20) baseline = ResidentBytes();
    if (batches > 20) peak = std::max(peak, ResidentBytes());
  }
  EXPECT_GT(batches, 150u);
  // Window (2) + prefetch (2) + the chunks a batch and the plan-ahead straddle.
  EXPECT_LE(max_open, 8u);
  // Flat: after warm-up, the rest of the file adds less than a few chunks' worth.
  EXPECT_LT(peak, baseline + (12u << 20)) << "baseline " << baseline << " peak " << peak;
}

}  // namespace
}  // namespace conveyor::testing
