// The host executor itself: every (block, thread) of a launch runs once with the coordinates
// the device would give; a phased kernel's threads all finish a phase before any starts the
// next; shared memory starts as garbage; the reverse order exposes a racy kernel.
#include "cuda/kernels/host_executor.h"

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::gpu {
namespace {

struct Recorder {
  std::vector<Grid>* seen;
  void operator()(const Grid& g) const { seen->push_back(g); }
};

TEST(HostExecutor, RunsEveryBlockAndThreadOnceWithTheLaunchsDimensions) {
  std::vector<Grid> seen;
  RunOnHost(Recorder{&seen}, {3, 5});
  ASSERT_EQ(seen.size(), 15u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].block, i / 5);
    EXPECT_EQ(seen[i].thread, i % 5);
    EXPECT_EQ(seen[i].block_dim, 5u);
    EXPECT_EQ(seen[i].grid_dim, 3u);
    EXPECT_EQ(seen[i].global_thread(), i);
    EXPECT_EQ(seen[i].global_threads(), 15u);
  }
}

TEST(HostExecutor, TheReverseOrderVisitsBlocksAndThreadsBackwards) {
  std::vector<Grid> seen;
  RunOnHost(Recorder{&seen}, {2, 3}, ThreadOrder::kReverse);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(std::make_pair(seen.front().block, seen.front().thread), std::make_pair(1u, 2u));
  EXPECT_EQ(std::make_pair(seen.back().block, seen.back().thread), std::make_pair(0u, 0u));
}

TEST(HostExecutor, TheLaunchPoliciesShapesCoverTheWorkOrCapTheGrid) {
  EXPECT_EQ(BlockPerItem(0, kDeviceLaunchPolicy).blocks, 1u);
  EXPECT_EQ(BlockPerItem(70000, kDeviceLaunchPolicy).blocks, 65535u);
  EXPECT_EQ(ThreadPerItem(257, kDeviceLaunchPolicy).blocks, 2u);
  EXPECT_EQ(ThreadPerItem(257, {3, 37}).blocks, 3u);
  EXPECT_EQ(ThreadPerItem(257, {3, 37}).threads, 37u);
}

// A phased kernel that logs (phase, step, block, thread) and checks its shared memory.
struct PhasedLog {
  static constexpr int kPhases = 2;
  struct Shared {
    float value[4];
  };
  uint64_t n;
  std::vector<std::tuple<int, uint64_t, uint32_t, uint32_t>>* log;
  std::vector<bool>* fresh;  // per block: shared memory was garbage (NaN) when first seen
  uint64_t steps() const { return n; }
  void operator()(int phase, uint64_t step, const Grid& g, Shared& s) const {
    if (phase == 0 && g.thread == 0 && step == g.block) (*fresh)[g.block] = std::isnan(s.value[0]);
    if (phase == 0) s.value[g.thread % 4] = static_cast<float>(step);
    log->emplace_back(phase, step, g.block, g.thread);
  }
};

TEST(HostExecutor, PhasedKernelsFinishEachPhaseInEveryThreadBeforeTheNext) {
  std::vector<std::tuple<int, uint64_t, uint32_t, uint32_t>> log;
  std::vector<bool> fresh(2, false);
  RunPhasedOnHost(PhasedLog{5, &log, &fresh}, {2, 3});
  // Block 0 takes steps 0, 2, 4; block 1 steps 1, 3 (a grid-stride loop), phases in order.
  ASSERT_EQ(log.size(), 5u * 2 * 3);
  size_t at = 0;
  for (uint32_t block : {0u, 1u}) {
    for (uint64_t step = block; step < 5; step += 2) {
      for (int phase = 0; phase < 2; ++phase) {
        for (uint32_t thread = 0; thread < 3; ++thread, ++at) {
          EXPECT_EQ(log[at], std::make_tuple(phase, step, block, thread)) << at;
        }
      }
    }
  }
  EXPECT_TRUE(fresh[0]);
  EXPECT_TRUE(fresh[1]);
}

// Thread t reads what thread t + 1 writes, with no barrier between: racy on the device. The
// two orders give different results, which is how the tests' reversed shapes catch a race.
struct Racy {
  int* cells;
  void operator()(const Grid& g) const {
    cells[g.thread] = cells[g.thread + 1] + 1;
    cells[g.thread + 1] = 10;
  }
};

TEST(HostExecutor, TheTwoOrdersDisagreeOnARacyKernel) {
  std::vector<int> forward(5, 0), reverse(5, 0);
  RunOnHost(Racy{forward.data()}, {1, 4});
  RunOnHost(Racy{reverse.data()}, {1, 4}, ThreadOrder::kReverse);
  EXPECT_NE(forward, reverse);
}

}  // namespace
}  // namespace conveyor::gpu
