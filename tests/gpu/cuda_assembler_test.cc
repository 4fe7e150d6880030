// One interface, two backends, one test: every standard generated batch is
// assembled by the CPU reference and by each backend here, and the bytes must agree. The
// host-program backend runs everywhere; the CUDA ones skip without a device.
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/sampling/loader.h"

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

// Every standard case as one generated batch (seeds from `seed`), planned, with the CPU
// assembler's bytes and a slot of its own (device memory unless `kind` says otherwise).
struct DeviceCases {
  std::vector<conveyor::testing::CaseSpec> cases = StandardCases();
  std::vector<conveyor::testing::BatchCase> batches;
  std::vector<BatchPlan> plans;
  std::vector<std::vector<std::byte>> want;
  std::unique_ptr<SlotPool> pool;
  std::vector<Slot> slots;

  explicit DeviceCases(uint64_t seed, MemoryKind kind = MemoryKind::kDevice) {
    auto cpu = MakeCpuAssembler();
    uint64_t largest = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      batches.push_back(MakeBatchCase(cases[i], seed + i));
      const auto& c = batches.back();
      auto plan = PlanBatch(c.streams, cases[i].precision, c.shape, c.pieces, c.layouts);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (!plan.ok()) return;
      largest = std::max(largest, plan->total_bytes);
      want.emplace_back(plan->total_bytes);
      EXPECT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(want.back())).ok());
      plans.push_back(std::move(*plan));
    }
    auto made = SlotPool::Create(kind, largest, static_cast<uint32_t>(plans.size()));
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return;
    pool = std::move(*made);
    for (size_t i = 0; i < plans.size(); ++i) {
      auto slot = pool->Acquire(absl::ZeroDuration());
      EXPECT_TRUE(slot.ok()) << slot.status();
      if (slot.ok()) slots.push_back(*slot);
    }
  }
  bool ready() const { return plans.size() == cases.size() && slots.size() == plans.size(); }
  // Case i's bytes in its slot equal the CPU's.
  void ExpectAssembled(size_t i) const {
    SCOPED_TRACE(cases[i].name);
    std::vector<std::byte> got(plans[i].total_bytes);
    ASSERT_TRUE(CopyMemory(got.data(), slots[i].data, got.size()).ok());
    EXPECT_TRUE(want[i] == got);
  }
};

// Every standard case begun at once through the pipelined host program (a worker thread
// runs the kernels' specification), each fence then the CPU's bytes.
TEST(HostProgramAssembler, EveryCaseBegunAtOnceCompletesAtItsFence) {
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler());
  DeviceCases d(500, MemoryKind::kHost);
  ASSERT_TRUE(d.ready());
  std::vector<uint64_t> fences;
  for (size_t i = 0; i < d.plans.size(); ++i) {
    auto fence = host->Begin(d.plans[i], d.batches[i].pieces, absl::MakeSpan(d.slots[i].data, d.slots[i].bytes));
    ASSERT_TRUE(fence.ok()) << fence.status();
    fences.push_back(*fence);
  }
  for (size_t i = 0; i < d.plans.size(); ++i) {
    ASSERT_TRUE(host->Wait(fences[i]).ok());
    d.ExpectAssembled(i);
  }
}

// Batches enqueued back to back (the host packing batch k+1 while the device assembles batch
// k, two staging buffers in turn) into distinct device slots: all correct after one sync.
TEST(CudaAssemblerGpu, BackToBackAsyncBatchesAreAllCorrect) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto assembler = CudaAssembler::Create({});
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  DeviceCases d(100);
  ASSERT_TRUE(d.ready());
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

// The whole loader with `assembler`, two batches in flight into slots of `kind` (as the
// daemon runs a CUDA IPC stream), over `config` opened with `open` (e.g. Kaldi CM left
// compressed): every batch equals the CPU loader's over the dataset opened plainly.
void ExpectPipelinedLoaderMatchesTheCpuLoader(const DatasetConfig& config, const DatasetOpenOptions& open,
                                              const LoaderOptions& lo, BatchAssembler* assembler, MemoryKind kind) {
  auto plain = Dataset::Open(config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto ds = Dataset::Open(config, open);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto cpu = MakeCpuAssembler();
  std::vector<std::vector<std::byte>> want;
  {
    auto loader = Loader::Create(plain->get(), cpu.get(), lo);
    ASSERT_TRUE(loader.ok());
    Batch b;
    while (*(*loader)->Next(&b)) want.emplace_back(b.bytes.begin(), b.bytes.end());
  }
  ASSERT_FALSE(want.empty());
  uint64_t largest = 0;
  for (const auto& w : want) largest = std::max<uint64_t>(largest, w.size());
  auto pool = SlotPool::Create(kind, largest, 3);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::deque<Slot> free_slots;
  for (int i = 0; i < 3; ++i) free_slots.push_back(*(*pool)->Acquire(absl::ZeroDuration()));
  std::deque<Slot> used;
  auto loader = Loader::Create(ds->get(), assembler, lo);
  ASSERT_TRUE(loader.ok());
  auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
    if (free_slots.empty() || bytes > largest) return absl::InternalError("no slot");
    used.push_back(free_slots.front());
    free_slots.pop_front();
    return absl::MakeSpan(used.back().data, bytes);
  };
  size_t n = 0;
  absl::Status st = RunPipelined(loader->get(), 2, destination, [&](const Batch& b) -> absl::Status {
    if (n >= want.size()) return absl::InternalError("more batches than the CPU loader's");
    std::vector<std::byte> got(b.bytes.size());
    if (absl::Status copied = CopyMemory(got.data(), b.bytes.data(), got.size()); !copied.ok()) return copied;
    EXPECT_TRUE(got == want[n]) << "batch " << n;
    ++n;
    free_slots.push_back(used.front());
    used.pop_front();
    return absl::OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(n, want.size());
}

// A randomized sparse + dense CTF file of many small chunks.
DatasetConfig CtfConfig() {
  const std::string path = ::testing::TempDir() + "/conveyor_gpu_loader.ctf";
  std::FILE* f = std::fopen(path.c_str(), "w");
  for (int i = 0; f != nullptr && i < 3000; ++i) {
    const int len = 1 + i % 5;
    for (int t = 0; t < len; ++t) {
      std::fprintf(f, "%d |x %d:%d.5 %d:1 |y %d %d\n", i, (i * 7 + t) % 1000, t, (i + 3 * t) % 1000, i % 3, t);
    }
  }
  if (f != nullptr) std::fclose(f);
  auto config = ParseConfig(
      "datasets:\n  d:\n    deserializers:\n      - type: CNTKTextFormat\n        chunkSizeInBytes: 4000\n        file: " +
          path + "\n        input:\n          x: {dim: 1000, format: sparse}\n          y: {dim: 2, format: dense}\n",
      "test", "/");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? config->datasets[0] : DatasetConfig();
}

LoaderOptions Randomized(uint64_t minibatch, bool frames) {
  LoaderOptions lo;
  lo.planner.minibatch_size = minibatch;
  lo.planner.randomizer.randomize = true;
  lo.planner.randomizer.window = 3;
  lo.planner.randomizer.frame_mode = frames;
  lo.threads = 2;
  return lo;
}

// Kaldi features as CM (1 byte, column headers), CM2 and CM3, joined with alignments, with
// an scp row/column range, left compressed in the chunks for the assembler to decode.
std::vector<DatasetConfig> CompressedKaldiConfigs() {
  std::vector<DatasetConfig> out;
  const std::string kaldi = conveyor::testing::TestdataDir() + "/kaldi";
  const std::string ranges = ::testing::TempDir() + "/conveyor_gpu_cm_ranges.scp";
  if (std::FILE* f = std::fopen(ranges.c_str(), "w")) {
    std::fprintf(f, "r1 %s/cm_auto.ark:14[2:10,3:12]\nr2 %s/cm_auto.ark:1169[0:30,3:12]\n", kaldi.c_str(), kaldi.c_str());
    std::fclose(f);
  }
  for (const std::string& rspecifier : {"scp:" + kaldi + "/cm_auto.scp", "scp:" + kaldi + "/cm_2byte_auto.scp",
                                        "scp:" + kaldi + "/cm_1byte_auto.scp", "scp:" + kaldi + "/cm_speech.scp",
                                        "scp:" + ranges}) {
    for (const char* precision : {"float", "double"}) {
      auto config = ParseConfig(std::string("datasets:\n  d:\n    maxErrors: 1000\n    precision: ") + precision +
                                    "\n    deserializers:\n      - type: KaldiTable\n        chunkSizeInBytes: 3000\n"
                                    "        rspecifier: \"" + rspecifier + "\"\n        input: {features: {}}\n",
                                "test", "/");
      EXPECT_TRUE(config.ok()) << config.status();
      if (config.ok()) out.push_back(config->datasets[0]);
    }
  }
  return out;
}

// Every compressed Kaldi configuration, left compressed in the chunks, in utterances, random
// frames and frames in file order (merged decode runs), through `assembler`.
void ExpectCompressedKaldiMatchesTheCpuLoader(BatchAssembler* assembler, MemoryKind kind) {
  DatasetOpenOptions open;
  open.compressed_in_place = true;
  open.diagnostics_sink = [](Severity, const std::string&) {};
  for (const DatasetConfig& config : CompressedKaldiConfigs()) {
    for (int mode = 0; mode < 3; ++mode) {
      const bool frames = mode > 0;
      LoaderOptions lo = Randomized(frames ? 64 : 100, frames);
      lo.planner.randomizer.randomize = mode < 2;
      SCOPED_TRACE(config.deserializers[0].rspecifier + (frames ? " frames" : " utterances") +
                   (mode == 2 ? " in order" : "") + (config.precision == Precision::kDouble ? " double" : " float"));
      ExpectPipelinedLoaderMatchesTheCpuLoader(config, open, lo, assembler, kind);
    }
  }
}

TEST(HostProgramAssembler, PipelinedLoaderMatchesTheCpuLoader) {
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler());
  ExpectPipelinedLoaderMatchesTheCpuLoader(CtfConfig(), {}, Randomized(64, false), host.get(), MemoryKind::kHost);
}

// The program's decode ops (what the kernel does, run on the host) against the CPU decoder.
TEST(HostProgramAssembler, CompressedKaldiMatricesDecodeAsTheCpuDecoder) {
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler());
  ExpectCompressedKaldiMatchesTheCpuLoader(host.get(), MemoryKind::kHost);
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
}

}  // namespace
}  // namespace conveyor::gpu
