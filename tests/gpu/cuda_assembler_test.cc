// One interface, two backends, one test: every standard generated batch is
// assembled by the CPU reference and by each backend here, and the bytes must agree. The
// host-program backend (the kernels on the host executor) runs everywhere; the CUDA ones
// skip without a device. The CUDA assembler's pipelining, on the device.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cases/batch_cases.h"
#include "cuda/cuda_assembler.h"
#include "cuda/host_program.h"
#include "cuda/slot_pool.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_cases.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/loader_cases.h"

namespace conveyor::gpu {
namespace {

using conveyor::testing::CtfConfig;
using conveyor::testing::DeviceCases;
using conveyor::testing::ExpectCompressedKaldiMatchesTheCpuLoader;
using conveyor::testing::ExpectPipelinedLoaderMatchesTheCpuLoader;
using conveyor::testing::MakeBatchCase;
using conveyor::testing::Randomized;
using conveyor::testing::StandardCases;

struct HostProgramBackend {
  static constexpr bool kNeedsDevice = false;
  static constexpr MemoryKind kDestination = MemoryKind::kHost;
  static absl::StatusOr<std::unique_ptr<BatchAssembler>> Make() { return MakeHostProgramAssembler(); }
};

// Assembled in place in device memory.
struct CudaDeviceBackend {
  static constexpr bool kNeedsDevice = true;
  static constexpr MemoryKind kDestination = MemoryKind::kDevice;
  static absl::StatusOr<std::unique_ptr<BatchAssembler>> Make() { return MakeCudaAssembler(0); }
};

// Destination in pinned host memory (the shared-memory and inline transports): assembled on
// the device, copied back.
struct CudaPinnedBackend {
  static constexpr bool kNeedsDevice = true;
  static constexpr MemoryKind kDestination = MemoryKind::kPinned;
  static absl::StatusOr<std::unique_ptr<BatchAssembler>> Make() { return MakeCudaAssembler(0); }
};

template <typename Backend>
class AssemblerEquivalence : public ::testing::Test {};
using Backends = ::testing::Types<HostProgramBackend, CudaDeviceBackend, CudaPinnedBackend>;
TYPED_TEST_SUITE(AssemblerEquivalence, Backends);

TYPED_TEST(AssemblerEquivalence, EveryStandardCaseMatchesTheCpuReferenceByteForByte) {
  if (TypeParam::kNeedsDevice) CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto cpu = MakeCpuAssembler();
  auto backend = TypeParam::Make();
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const auto& spec : StandardCases()) {
    // Seed 13: values narrowed (float16 / bfloat16 in turn) where the case is float.
    for (uint64_t seed : {11, 12, 13}) {
      if (seed == 13 && spec.precision != Precision::kFloat) continue;
      SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
      auto c = MakeBatchCase(spec, seed);
      const std::vector<DType> dtypes = seed == 13 ? NarrowedDTypes(c) : std::vector<DType>{};
      auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts, dtypes);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<std::byte> want(plan->total_bytes);
      ASSERT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(want)).ok());
      // (Slots are never empty: an empty batch's plan of no bytes gets a slot of one.)
      auto pool = SlotPool::Create(TypeParam::kDestination, std::max<uint64_t>(plan->total_bytes, 1), 1);
      ASSERT_TRUE(pool.ok()) << pool.status();
      auto slot = (*pool)->Acquire(absl::ZeroDuration());
      ASSERT_TRUE(slot.ok());
      std::vector<std::byte> garbage(slot->bytes, std::byte{0xCD});  // every byte must be written
      ASSERT_TRUE(CopyMemory(slot->data, garbage.data(), garbage.size()).ok());
      absl::Status st = (*backend)->Assemble(*plan, c.pieces, absl::MakeSpan(slot->data, slot->bytes));
      ASSERT_TRUE(st.ok()) << st;
      std::vector<std::byte> got(plan->total_bytes);
      ASSERT_TRUE(CopyMemory(got.data(), slot->data, got.size()).ok());
      size_t first = 0;
      while (first < want.size() && got[first] == want[first]) ++first;
      EXPECT_EQ(first, want.size()) << (*backend)->name() << ": first differing byte " << first << " of "
                                     << want.size();
    }
  }
}

TEST(CudaAssembler, IsUnimplementedWithoutTheBackend) {
  if (CudaBuilt()) GTEST_SKIP() << "this build has the CUDA backend";
  auto a = CudaAssembler::Create({});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnimplemented);
  std::string note;
  auto chosen = SelectAssembler(true, 0, &note);
  EXPECT_STREQ(chosen->name(), "cpu");
  EXPECT_NE(note.find("assembler: cpu (no CUDA device"), std::string::npos) << note;
}

TEST(CudaAssembler, RefusesADeviceThatIsNotThere) {
  CudaAssemblerOptions options;
  options.device = 4096;
  auto a = CudaAssembler::Create(options);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(a.status().code() == absl::StatusCode::kFailedPrecondition ||
              a.status().code() == absl::StatusCode::kUnimplemented)
      << a.status();
}

// Batches enqueued back to back (the host packing batch k+1 while the device assembles batch
// k, two staging buffers in turn) into distinct device slots: all correct after one sync.
// The stream is stalled first (a kernel spinning for 300 ms), so the host runs far ahead of
// the copies: without the guard on a staging buffer's reuse (Enqueue waits for its `sent`
// event), batch k + 2 would overwrite batch k's pinned bytes before they were sent.
TEST(CudaAssemblerGpu, BackToBackAsyncBatchesAreAllCorrect) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(100);
  ASSERT_TRUE(d.ready());
  ASSERT_TRUE((*assembler)->StallForTesting(absl::Milliseconds(300)).ok());
  for (size_t i = 0; i < d.plans.size(); ++i) {
    ASSERT_TRUE((*assembler)->AssembleAsync(d.plans[i], d.batches[i].pieces, d.slots[i].data).ok());
  }
  ASSERT_TRUE((*assembler)->Synchronize().ok());
  for (size_t i = 0; i < d.plans.size(); ++i) d.ExpectAssembled(i);
}

// The pipelined interface: every batch begun into its own device slot, then, once Begin()
// has returned, the host scribbles over the chunks the batch was made from (the device must
// have taken what it needs into staging already); each fence then yields the CPU's bytes.
TEST(CudaAssemblerGpu, FencedBatchesNoLongerReadTheChunksOnceBegun) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(300);
  ASSERT_TRUE(d.ready());
  std::vector<uint64_t> fences;
  for (size_t i = 0; i < d.plans.size(); ++i) {
    auto fence = (*assembler)->Begin(d.plans[i], d.batches[i].pieces, absl::MakeSpan(d.slots[i].data, d.slots[i].bytes));
    ASSERT_TRUE(fence.ok()) << fence.status();
    fences.push_back(*fence);
    for (auto& chunk : d.batches[i].chunks) {
      for (ParsedStream& ps : chunk->streams) {
        std::fill(ps.values_f32.begin(), ps.values_f32.end(), -7.0f);
        std::fill(ps.values_f64.begin(), ps.values_f64.end(), -7.0);
        std::fill(ps.indices.begin(), ps.indices.end(), 0);
      }
    }
  }
  for (size_t i = 0; i < d.plans.size(); ++i) {
    absl::Status st = (*assembler)->Wait(fences[i]);
    ASSERT_TRUE(st.ok()) << st;
    d.ExpectAssembled(i);
  }
  EXPECT_EQ((*assembler)->Wait(fences.back()).code(), absl::StatusCode::kInvalidArgument);  // waited for already
}

TEST(CudaAssemblerGpu, PipelinedLoaderMatchesTheCpuLoader) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto cuda = CudaAssembler::Create({});
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ExpectPipelinedLoaderMatchesTheCpuLoader(CtfConfig(), {}, Randomized(64, false), cuda->get(), MemoryKind::kDevice);
}

// Kaldi compressed matrices decoded on the device, in the data path: bit for bit the CPU
// decoder's values (no FMA contraction in the decode kernel).
TEST(CudaAssemblerGpu, CompressedKaldiMatricesDecodeOnTheDeviceAsOnTheCpu) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto cuda = CudaAssembler::Create({});
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ExpectCompressedKaldiMatchesTheCpuLoader(cuda->get(), MemoryKind::kDevice);
  EXPECT_GT((*cuda)->stats().decode_ops, 0u) << "no decode op ran on the device";
}

// HTK features left in their files: the frames are sent as they lie and the device builds
// the context windows (FramesKernel), bit for bit as the CPU assembler does.
TEST(CudaAssemblerGpu, HtkFramesLeftInTheirFilesMatchTheCpuLoader) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto cuda = CudaAssembler::Create({});
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  conveyor::testing::ExpectHtkFramesMatchTheCpuLoader(cuda->get(), MemoryKind::kDevice);
  EXPECT_GT((*cuda)->stats().frames_ops, 100u) << "no frames op ran on the device";
}

}  // namespace
}  // namespace conveyor::gpu
