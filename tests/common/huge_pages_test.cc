// The block cache behind HugeVector: blocks on 2 MiB boundaries in whole 2 MiB pages, advised
// for huge pages, kept when freed and handed out again for arrays of about their size, the
// kept ones capped and released on demand. The cap is set for this binary (16 MiB) before
// the first block is made.
#include "common/huge_pages.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/chunk/parsed_chunk.h"
#include "gtest/gtest.h"

namespace conveyor::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class CacheLimitEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { setenv("CONVEYOR_HUGE_BLOCK_CACHE_MB", "16", 1); }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new CacheLimitEnvironment);

// Each test starts with nothing kept. Under AddressSanitizer blocks are operator new: the
// block tests skip (HugeVector's own still runs).
class HugeBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HugeBlocksInUse()) GTEST_SKIP() << "built with AddressSanitizer: arrays come from operator new";
    ReleaseHugeBlocks();
  }
  void TearDown() override { ReleaseHugeBlocks(); }
};

TEST_F(HugeBlocks, TheCacheLimitComesFromTheEnvironment) {
  EXPECT_EQ(HugeBlockCacheLimit(), 16 * kMiB);
  setenv("CONVEYOR_HUGE_BLOCK_CACHE_MB", "0", 1);
  EXPECT_EQ(HugeBlockCacheLimit(), 0u);
  unsetenv("CONVEYOR_HUGE_BLOCK_CACHE_MB");
  const uint64_t fallback = HugeBlockCacheLimit();
  EXPECT_GT(fallback, 0u);
  EXPECT_LE(fallback, uint64_t{4} << 30);
  // Not a number of MiB: the default, not "-1" read as no cap at all.
  for (const char* bad : {"-1", "abc", "12x", "99999999999999999999999", " 5"}) {
    setenv("CONVEYOR_HUGE_BLOCK_CACHE_MB", bad, 1);
    EXPECT_EQ(HugeBlockCacheLimit(), fallback) << bad;
  }
  setenv("CONVEYOR_HUGE_BLOCK_CACHE_MB", "16", 1);
}

TEST_F(HugeBlocks, BlocksAreWholeAlignedHugePagesAndWritable) {
  const HugeBlockStats before = GetHugeBlockStats();
  void* p = AllocateHugeBlock(3 * kMiB + 1);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  std::memset(p, 0x5A, 4 * kMiB);  // the whole rounded block is ours
  const HugeBlockStats after = GetHugeBlockStats();
  EXPECT_EQ(after.mapped - before.mapped, 4 * kMiB);
  EXPECT_EQ(after.maps - before.maps, 1u);
  FreeHugeBlock(p, 3 * kMiB + 1);
}

TEST_F(HugeBlocks, AFreedBlockServesTheNextArrayOfItsSize) {
  void* p = AllocateHugeBlock(6 * kMiB);
  static_cast<char*>(p)[0] = 1;
  FreeHugeBlock(p, 6 * kMiB);
  EXPECT_EQ(GetHugeBlockStats().kept, 6 * kMiB);
  const HugeBlockStats before = GetHugeBlockStats();
  void* q = AllocateHugeBlock(5 * kMiB);  // rounds to 6 MiB: the same block
  EXPECT_EQ(q, p);
  const HugeBlockStats after = GetHugeBlockStats();
  EXPECT_EQ(after.reuses - before.reuses, 1u);
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_EQ(after.kept, 0u);
  // Freed with the size asked for (5 MiB): the block's own size is what is kept.
  FreeHugeBlock(q, 5 * kMiB);
  EXPECT_EQ(GetHugeBlockStats().kept, 6 * kMiB);
}

TEST_F(HugeBlocks, AMuchLargerBlockIsNotSpentOnASmallArray) {
  void* big = AllocateHugeBlock(12 * kMiB);
  FreeHugeBlock(big, 12 * kMiB);
  const HugeBlockStats before = GetHugeBlockStats();
  void* small = AllocateHugeBlock(2 * kMiB);  // 12 MiB is more than 1.5 x 2 MiB + 2 MiB
  EXPECT_NE(small, big);
  EXPECT_EQ(GetHugeBlockStats().maps - before.maps, 1u);
  void* fits = AllocateHugeBlock(8 * kMiB);  // 12 <= 8 + 4 + 2: the kept block serves
  EXPECT_EQ(fits, big);
  FreeHugeBlock(small, 2 * kMiB);
  FreeHugeBlock(fits, 8 * kMiB);
}

TEST_F(HugeBlocks, AnArrayIsChargedTheWholeBlockItHolds) {
  void* big = AllocateHugeBlock(10 * kMiB);
  FreeHugeBlock(big, 10 * kMiB);
  void* p = AllocateHugeBlock(8 * kMiB + 1);  // 10 MiB block reused (10 <= 10 + 2.5 + 2)
  ASSERT_EQ(p, big);
  EXPECT_EQ(HeldBytes(p, 8 * kMiB + 1), 10 * kMiB);
  int on_stack = 0;
  EXPECT_EQ(HeldBytes(&on_stack, 5 * kMiB), 5 * kMiB);  // not a block: what it says
  FreeHugeBlock(p, 8 * kMiB + 1);
  // A parsed chunk counts its arrays' blocks: 300000 values (1.2 MB) hold a 2 MiB block.
  ParsedChunk chunk;
  chunk.streams.resize(1);
  chunk.streams[0].values_f32.resize(300000);
  EXPECT_GE(chunk.MemoryBytes(), 2 * kMiB);
}

TEST_F(HugeBlocks, KeptBlocksStayUnderTheCapLargestGoingFirst) {
  void* a = AllocateHugeBlock(4 * kMiB);
  void* b = AllocateHugeBlock(8 * kMiB);
  void* c = AllocateHugeBlock(10 * kMiB);
  const uint64_t mapped = GetHugeBlockStats().mapped;
  FreeHugeBlock(a, 4 * kMiB);
  FreeHugeBlock(b, 8 * kMiB);
  EXPECT_EQ(GetHugeBlockStats().kept, 12 * kMiB);
  FreeHugeBlock(c, 10 * kMiB);  // 22 MiB > 16: the 10 MiB block goes
  const HugeBlockStats s = GetHugeBlockStats();
  EXPECT_EQ(s.kept, 12 * kMiB);
  EXPECT_EQ(s.mapped, mapped - 10 * kMiB);
  EXPECT_EQ(AllocateHugeBlock(8 * kMiB), b);
  EXPECT_EQ(AllocateHugeBlock(4 * kMiB), a);
  FreeHugeBlock(a, 4 * kMiB);
  FreeHugeBlock(b, 8 * kMiB);
}

TEST_F(HugeBlocks, ReleaseUnmapsEveryKeptBlock) {
  void* a = AllocateHugeBlock(2 * kMiB);
  void* b = AllocateHugeBlock(4 * kMiB);
  FreeHugeBlock(a, 2 * kMiB);
  FreeHugeBlock(b, 4 * kMiB);
  const uint64_t mapped = GetHugeBlockStats().mapped;
  EXPECT_EQ(ReleaseHugeBlocks(), 6 * kMiB);
  EXPECT_EQ(GetHugeBlockStats().kept, 0u);
  EXPECT_EQ(GetHugeBlockStats().mapped, mapped - 6 * kMiB);
}

TEST(HugeVectors, KeepTheirValuesAcrossGrowthAndBlocks) {
  HugeVector<int32_t> v;
  for (int32_t i = 0; i < 3'000'000; ++i) v.push_back(i * 7);  // 12 MB: grows through blocks
  if (HugeBlocksInUse()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  }
  for (int32_t i = 0; i < 3'000'000; ++i) ASSERT_EQ(v[i], i * 7) << i;
  HugeVector<int32_t> w = v;  // copies, moves and swaps between instances of the allocator
  HugeVector<int32_t> x = std::move(v);
  x.swap(w);
  EXPECT_EQ(x, w);
  HugeVector<int32_t> small(100, 3);  // below a block: from operator new
  EXPECT_EQ(small.back(), 3);
}

// resize(n) in a block handed out again: numbers and pointers keep what the block held (the
// parsers and sorts write every element they add), structs are zeroed, and a value given is
// written. Each array gets the block a 3 MiB array of 0xAB bytes just gave back (a freed
// block serves the next array of its size).
TEST_F(HugeBlocks, ResizeLeavesNumbersUnwrittenAndZeroesStructs) {
  constexpr size_t kBytes = 3 * kMiB;
  auto dirty = [] {
    HugeVector<uint8_t> d(kBytes, 0xAB);
    return static_cast<const void*>(d.data());
  };
  const void* block = dirty();
  HugeVector<float> f;
  f.resize(kBytes / sizeof(float));
  ASSERT_EQ(static_cast<const void*>(f.data()), block);
  uint32_t bits = 0;
  std::memcpy(&bits, &f.back(), 4);
  EXPECT_EQ(bits, 0xABABABABu);
  f.resize(f.size() / 2);
  f.resize(kBytes / sizeof(float), 0.0f);  // asked for zeros: zeros
  EXPECT_EQ(f[f.size() / 2], 0.0f);
  EXPECT_EQ(f.back(), 0.0f);
  f = HugeVector<float>();

  ASSERT_EQ(dirty(), block);
  HugeVector<uint64_t> u(kBytes / sizeof(uint64_t));  // the count constructor: the same
  ASSERT_EQ(static_cast<const void*>(u.data()), block);
  EXPECT_EQ(u[0], 0xABABABABABABABABu);
  EXPECT_EQ(u.back(), 0xABABABABABABABABu);
  u = HugeVector<uint64_t>();

  ASSERT_EQ(dirty(), block);
  HugeVector<const std::byte*> where;
  where.resize(kBytes / sizeof(const std::byte*));
  ASSERT_EQ(static_cast<const void*>(where.data()), block);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(where.back()), uintptr_t{0xABABABABABABABABu});
  where = HugeVector<const std::byte*>();

  ASSERT_EQ(dirty(), block);
  struct Pair {
    uint64_t a, b;
  };
  HugeVector<Pair> p;
  p.resize(kBytes / sizeof(Pair));
  ASSERT_EQ(static_cast<const void*>(p.data()), block);
  for (size_t k = 0; k < p.size(); k += 4099) ASSERT_EQ(p[k].a | p[k].b, 0u) << k;
  EXPECT_EQ(p.back().a | p.back().b, 0u);
}

// Whether the kernel may back the block with huge pages: its mapping's THPeligible in
// /proc/self/smaps (1 with the advice where THP is `always` or `madvise`).
TEST_F(HugeBlocks, BlocksAreEligibleForHugePagesWhereTheKernelAllowsThem) {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off on this kernel (" << mode << ")";
  }
  ASSERT_TRUE(HugePagesEnabled()) << "CONVEYOR_HUGE_PAGES=0 is set for this test";
  void* p = AllocateHugeBlock(4 * kMiB);
  std::memset(p, 1, 4 * kMiB);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_block = false;
  int eligible = -1;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in_block = lo <= at && at < hi;
      continue;
    }
    if (in_block && line.rfind("THPeligible:", 0) == 0) eligible = std::atoi(line.c_str() + 12);
  }
  FreeHugeBlock(p, 4 * kMiB);
  EXPECT_EQ(eligible, 1) << "THP mode " << mode;
}

}  // namespace
}  // namespace conveyor::testing
