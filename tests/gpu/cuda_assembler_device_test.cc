// The CUDA assembler's device-side paths that the standard cases do not reach on their own:
// Thrust's temporary storage past the scan buffer, staging grown past its initial size (and
// past the default 32 MiB), a device other than 0 used from a thread whose current device is
// 0, and random CM/CM2/CM3 matrices through the data path's decode ops. All skip without a
// device (and fail under CONVEYOR_REQUIRE_GPU=1).
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(CONVEYOR_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "cuda/cases/batch_cases.h"
#include "cuda/cases/compressed_cases.h"
#include "cuda/cuda_assembler.h"
#include "cuda/slot_pool.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

using conveyor::testing::CaseSpec;
using conveyor::testing::DeviceCases;

// Every case through `assembler` (Assemble: synchronous), each slot then the CPU's bytes.
void ExpectAllAssembled(CudaAssembler* assembler, const DeviceCases& d) {
  for (size_t i = 0; i < d.plans.size(); ++i) {
    absl::Status st = assembler->Assemble(d.plans[i], d.batches[i].pieces, d.slot(i));
    ASSERT_TRUE(st.ok()) << d.cases[i].name << ": " << st;
    d.ExpectAssembled(i);
  }
}

TEST(CudaAssemblerGpu, ScansPastTheScanBufferAllocateOnceThenTheBufferGrows) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  CudaAssemblerOptions options;
  options.scan_buffer_bytes = 0;  // every scan's temporary storage is too large at first
  auto assembler = CudaAssembler::Create(options);
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(700);
  ASSERT_TRUE(d.ready());
  ExpectAllAssembled(assembler->get(), d);
  const uint64_t fallbacks = (*assembler)->scan_buffer_fallbacks();
  EXPECT_GT(fallbacks, 0u) << "the stream-ordered fallback never ran";
  EXPECT_GT((*assembler)->stats().scans, 0u);
  ExpectAllAssembled(assembler->get(), d);  // the buffer has grown to the largest request
  EXPECT_EQ((*assembler)->scan_buffer_fallbacks(), fallbacks);
}

TEST(CudaAssemblerGpu, StagingGrowsFromASmallStartWithBatchesInFlight) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  CudaAssemblerOptions options;
  options.staging_bytes = 64 << 10;
  auto assembler = CudaAssembler::Create(options);
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(800);
  ASSERT_TRUE(d.ready());
  // Begun back to back: each growth must wait for the batch still using the buffer.
  std::vector<uint64_t> fences;
  for (size_t i = 0; i < d.plans.size(); ++i) {
    auto fence = (*assembler)->Begin(d.plans[i], d.batches[i].pieces, d.slot(i));
    ASSERT_TRUE(fence.ok()) << fence.status();
    fences.push_back(*fence);
  }
  for (size_t i = 0; i < d.plans.size(); ++i) {
    ASSERT_TRUE((*assembler)->Wait(fences[i]).ok());
    d.ExpectAssembled(i);
  }
}

TEST(CudaAssemblerGpu, BatchesPastTheDefault32MiBStagingGrowIt) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  CaseSpec big;
  big.name = "dense_frames_40MB";
  big.rows = 8192;
  big.mode = conveyor::testing::Mode::kFrame;
  big.streams = {{StreamFormat::kDense, 1250}, {StreamFormat::kSparse, 5000, OutputLayout::kCsr, 0.1, 20}};
  DeviceCases d(900, MemoryKind::kDevice, {big, big});
  ASSERT_TRUE(d.ready());
  ASSERT_GT(d.plans[0].total_bytes, uint64_t{32} << 20);
  ExpectAllAssembled(assembler->get(), d);
  DeviceCases host(901, MemoryKind::kPinned, {big});  // through a device buffer of the assembler's, grown too
  ASSERT_TRUE(host.ready());
  ExpectAllAssembled(assembler->get(), host);
}

// The last device, from threads whose current device is 0: the assembler selects its own
// before allocating (its download buffers) or launching, and when destroyed.
TEST(CudaAssemblerGpu, ADeviceOtherThanZeroServesThreadsOnDeviceZero) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
#if defined(CONVEYOR_HAVE_CUDA)
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (n < 2) GTEST_SKIP() << "only one CUDA device here: a device other than 0 cannot be tested";
  CudaAssemblerOptions options;
  options.device = n - 1;
  auto assembler = CudaAssembler::Create(options);
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases pinned(1000, MemoryKind::kPinned);
  ASSERT_TRUE(pinned.ready());
  std::thread producer([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ExpectAllAssembled(assembler->get(), pinned);  // host destinations: through its download buffers
    int current = -1;
    cudaGetDevice(&current);
    EXPECT_EQ(current, n - 1);
  });
  producer.join();
  std::thread destroyer([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    assembler->reset();
    int current = -1;
    cudaGetDevice(&current);
    EXPECT_EQ(current, 0) << "destruction leaves the thread's device as it was";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  });
  destroyer.join();
#endif
}

// Host destinations: each batch is assembled in a device buffer of the assembler's and copied
// back on a second stream, by DMA into page-locked memory or through a pinned buffer into
// pageable memory, while the next batch is assembled. Batches begun back to back behind a
// stalled stream (so that every copy waits on an assembly, and the host runs ahead of both)
// must land exactly, each in its own destination.
TEST(CudaAssemblerGpu, HostDestinationsComeBackAsynchronouslyDirectOrStaged) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  for (MemoryKind kind : {MemoryKind::kPinned, MemoryKind::kHost}) {
    SCOPED_TRACE(MemoryKindName(kind));
    auto assembler = CudaAssembler::Create({});
    ASSERT_TRUE(assembler.ok()) << assembler.status();
    DeviceCases d(1100, kind);
    ASSERT_TRUE(d.ready());
    ASSERT_TRUE((*assembler)->StallForTesting(absl::Milliseconds(200)).ok());
    std::vector<uint64_t> fences;
    for (size_t i = 0; i < d.plans.size(); ++i) {
      auto fence = (*assembler)->Begin(d.plans[i], d.batches[i].pieces, d.slot(i));
      ASSERT_TRUE(fence.ok()) << d.cases[i].name << ": " << fence.status();
      fences.push_back(*fence);
    }
    for (size_t i = 0; i < d.plans.size(); ++i) {
      ASSERT_TRUE((*assembler)->Wait(fences[i]).ok());
      d.ExpectAssembled(i);
    }
    const DownloadStats s = (*assembler)->downloads();
    const uint64_t n = d.plans.size();
    EXPECT_EQ(s.direct, kind == MemoryKind::kPinned ? n : 0u);
    EXPECT_EQ(s.staged, kind == MemoryKind::kHost ? n : 0u);
    EXPECT_EQ(s.buffers, n) << "every batch was in flight at once: one buffer each";
  }
}

// Memory registered after it was made (what the shm and inline transports do with their
// segments and buffers) is written by DMA, like cudaHostAlloc's; and a producer that keeps
// two batches in flight (begin k+1, then wait for k: the daemon's loop) reuses two buffers.
TEST(CudaAssemblerGpu, RegisteredDestinationsAreWrittenDirectlyAndTwoInFlightReuseTwoBuffers) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(1200, MemoryKind::kHost);
  ASSERT_TRUE(d.ready());
  const uint64_t bytes = d.pool->slot_bytes() * d.pool->slots();
  auto locked = RegisterHostMemory(d.pool->base(), bytes, 0);
  ASSERT_TRUE(locked.ok()) << locked.status();
  for (int round = 0; round < 3; ++round) {
    std::optional<std::pair<size_t, uint64_t>> previous;
    for (size_t i = 0; i < d.plans.size(); ++i) {
      auto fence = (*assembler)->Begin(d.plans[i], d.batches[i].pieces, d.slot(i));
      ASSERT_TRUE(fence.ok()) << d.cases[i].name << ": " << fence.status();
      if (previous) {
        ASSERT_TRUE((*assembler)->Wait(previous->second).ok());
        d.ExpectAssembled(previous->first);
      }
      previous = {i, *fence};
    }
    ASSERT_TRUE((*assembler)->Wait(previous->second).ok());
    d.ExpectAssembled(previous->first);
  }
  const DownloadStats s = (*assembler)->downloads();
  EXPECT_EQ(s.direct, 3 * d.plans.size());
  EXPECT_EQ(s.staged, 0u);
  EXPECT_EQ(s.buffers, 2u);
}

// Random matrices of each kind (every byte value), whole, windowed, in frames, through the
// device's decode ops (the data path), long runs split in bands.
TEST(CudaAssemblerGpu, RandomCompressedMatricesThroughTheDecodeOpsMatchTheCpuDecoder) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  auto cpu = MakeCpuAssembler();
  std::mt19937 rng(7);
  for (int format : {1, 2, 3}) {
    for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {1000, 40}, {3, 700}, {257, 13}, {5000, 1}}) {
      std::vector<std::string> objects;
      for (int i = 0; i < 3; ++i) objects.push_back(conveyor::testing::RandomCompressed(format, rows, cols, rng));
      for (auto pieces : {conveyor::testing::CompressedPieces::kUtterances,
                          conveyor::testing::CompressedPieces::kFramesInOrder,
                          conveyor::testing::CompressedPieces::kRandomFrames}) {
        for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
          SCOPED_TRACE(::testing::Message() << "CM" << format << " " << rows << "x" << cols << " pieces "
                                            << static_cast<int>(pieces));
          auto c = conveyor::testing::MakeCompressedCase(objects, 0, 0, static_cast<uint32_t>(cols), pieces, 3);
          auto plan = PlanBatch(c.streams, precision, c.shape, c.pieces);
          ASSERT_TRUE(plan.ok()) << plan.status();
          std::vector<std::byte> want(plan->total_bytes), got(plan->total_bytes);
          ASSERT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(want)).ok());
          auto pool = SlotPool::Create(MemoryKind::kDevice, plan->total_bytes, 1);
          ASSERT_TRUE(pool.ok()) << pool.status();
          auto slot = (*pool)->Acquire(absl::ZeroDuration());
          ASSERT_TRUE(slot.ok());
          ASSERT_TRUE((*assembler)->Assemble(*plan, c.pieces, absl::MakeSpan(slot->data, plan->total_bytes)).ok());
          ASSERT_TRUE(CopyMemory(got.data(), slot->data, got.size()).ok());
          EXPECT_TRUE(got == want);
        }
      }
    }
  }
  EXPECT_GT((*assembler)->stats().decode_ops, 100u) << "the decode ops did not run on the device";
}

}  // namespace
}  // namespace conveyor::gpu
