// One interface, two backends, one test (STYLE.md 11): every standard generated batch is
// assembled by the CPU reference and by each backend here, and the bytes must agree. The
// host-program backend runs everywhere; the CUDA ones skip without a device.
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/assembly_program.h"
#include "cuda/cuda_assembler.h"
#include "cuda/slot_pool.h"
#include "gtest/gtest.h"
#include "tests/gpu/batch_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

using conveyor::testing::MakeBatchCase;
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
    for (uint64_t seed : {11, 12}) {
      SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
      auto c = MakeBatchCase(spec, seed);
      auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<std::byte> want(plan->total_bytes);
      ASSERT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(want)).ok());
      auto pool = SlotPool::Create(TypeParam::kDestination, plan->total_bytes, 1);
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
TEST(CudaAssemblerGpu, BackToBackAsyncBatchesAreAllCorrect) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  auto cpu = MakeCpuAssembler();
  const auto cases = StandardCases();
  std::vector<conveyor::testing::BatchCase> batches;
  std::vector<BatchPlan> plans;
  uint64_t largest = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    batches.push_back(MakeBatchCase(cases[i], 100 + i));
    auto plan = PlanBatch(batches.back().streams, cases[i].precision, batches.back().shape, batches.back().pieces,
                          batches.back().layouts);
    ASSERT_TRUE(plan.ok());
    largest = std::max(largest, plan->total_bytes);
    plans.push_back(std::move(*plan));
  }
  auto pool = SlotPool::Create(MemoryKind::kDevice, largest, static_cast<uint32_t>(plans.size()));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<Slot> slots;
  for (size_t i = 0; i < plans.size(); ++i) {
    auto slot = (*pool)->Acquire(absl::ZeroDuration());
    ASSERT_TRUE(slot.ok());
    slots.push_back(*slot);
    ASSERT_TRUE((*assembler)->AssembleAsync(plans[i], batches[i].pieces, slot->data).ok());
  }
  ASSERT_TRUE((*assembler)->Synchronize().ok());
  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    std::vector<std::byte> want(plans[i].total_bytes), got(plans[i].total_bytes);
    ASSERT_TRUE(cpu->Assemble(plans[i], batches[i].pieces, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(CopyMemory(got.data(), slots[i].data, got.size()).ok());
    EXPECT_TRUE(want == got);
  }
}

}  // namespace
}  // namespace conveyor::gpu
