// The CUDA kernels' own code (cuda/kernels/), run by the host executor, against the CPU
// assembler byte for byte: every standard batch case, random CM/CM2/CM3 matrices through the
// data path's decode ops and through the CM decoder's kernel, the Kaldi archives of
// tests/data through the whole pipelined loader (scp ranges, frames, float and double,
// fences). Each under the device's launch shape and under small and odd ones (1 block,
// 1 thread, grids smaller than the work, blocks of 37 and 100 threads, reversed orders), so
// that every grid-stride loop runs more than once and a race between threads shows. CI runs
// this binary also under ASan and UBSan (scripts/fuzz.sh).
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/config/config_loader.h"
#include "common/formats/kaldi/kaldi_object.h"
#include "common/formats/kaldi/kaldi_table.h"
#include "cuda/cases/batch_cases.h"
#include "cuda/cases/compressed_cases.h"
#include "cuda/cm_decode_plan.h"
#include "cuda/host_program.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/loader_cases.h"

namespace conveyor::gpu {
namespace {

using conveyor::testing::CompressedPieces;

struct Shape {
  const char* name;
  HostLaunch launch;
};

const Shape kShapes[] = {
    {"Device", {kDeviceLaunchPolicy, ThreadOrder::kForward}},
    {"OneBlockOneThread", {{1, 1}, ThreadOrder::kForward}},
    {"OneBlockReversed", {{1, 256}, ThreadOrder::kReverse}},
    {"ThreeBlocksOf37", {{3, 37}, ThreadOrder::kForward}},
    {"SevenBlocksOfOneReversed", {{7, 1}, ThreadOrder::kReverse}},
    {"TwoBlocksOf100Reversed", {{2, 100}, ThreadOrder::kReverse}},
};

class HostKernels : public ::testing::TestWithParam<Shape> {
 protected:
  HostLaunch launch() const { return GetParam().launch; }
};

INSTANTIATE_TEST_SUITE_P(Shapes, HostKernels, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& shape) { return std::string(shape.param.name); });

// `got` equals `want`; else the first differing byte.
void ExpectSameBytes(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t first = 0;
  while (first < want.size() && got[first] == want[first]) ++first;
  EXPECT_EQ(first, want.size()) << "first differing byte " << first << " of " << want.size();
}

// The batch of `pieces` by the CPU assembler and by the host program with `launch`.
void ExpectHostProgramMatchesTheCpu(const std::vector<StreamConfig>& streams, Precision precision,
                                    const BatchShape& shape, const std::vector<PieceRef>& pieces,
                                    const std::vector<OutputLayout>& layouts, const HostLaunch& launch,
                                    ProgramStats* stats = nullptr) {
  auto plan = PlanBatch(streams, precision, shape, pieces, layouts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::byte> want(plan->total_bytes), got(plan->total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, pieces, absl::MakeSpan(want)).ok());
  absl::Status st = MakeHostProgramAssembler(launch, stats)->Assemble(*plan, pieces, absl::MakeSpan(got));
  ASSERT_TRUE(st.ok()) << st;
  ExpectSameBytes(got, want);
}

TEST_P(HostKernels, EveryStandardCaseMatchesTheCpuAssembler) {
  for (const auto& spec : conveyor::testing::StandardCases()) {
    for (uint64_t seed : {21, 22}) {
      SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
      auto c = conveyor::testing::MakeBatchCase(spec, seed);
      ExpectHostProgramMatchesTheCpu(c.streams, spec.precision, c.shape, c.pieces, c.layouts, launch());
    }
  }
}

// Random matrices of each kind and shape (every byte value), whole, windowed, in frames: the
// decode ops of the data path (DecodeOpsKernel), long runs split in bands.
TEST_P(HostKernels, RandomCompressedMatricesThroughTheDecodeOpsMatchTheCpuDecoder) {
  std::mt19937 rng(7);
  ProgramStats stats;
  for (int format : {1, 2, 3}) {
    for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {1000, 40}, {3, 700}, {257, 13}, {5000, 1}}) {
      std::vector<std::string> objects;
      for (int i = 0; i < 3; ++i) objects.push_back(conveyor::testing::RandomCompressed(format, rows, cols, rng));
      const int64_t row0 = rows > 2 ? 2 : 0, col0 = cols > 3 ? 3 : 0;
      for (auto pieces : {CompressedPieces::kUtterances, CompressedPieces::kFramesInOrder, CompressedPieces::kRandomFrames}) {
        for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
          for (bool window : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "CM" << format << " " << rows << "x" << cols << " pieces "
                                              << static_cast<int>(pieces) << (window ? " windowed" : "")
                                              << (precision == Precision::kDouble ? " double" : " float"));
            const uint32_t width = static_cast<uint32_t>(window ? cols - col0 : cols);
            auto c = conveyor::testing::MakeCompressedCase(objects, window ? row0 : 0, window ? col0 : 0, width, pieces,
                                                           static_cast<uint64_t>(rows));
            ASSERT_FALSE(c.pieces.empty());
            ExpectHostProgramMatchesTheCpu(c.streams, precision, c.shape, c.pieces, {}, launch(), &stats);
          }
        }
      }
    }
  }
  EXPECT_GT(stats.decode_ops, 100u);  // the data path's decode ops ran, not only host decoding
}

// The same matrices, and every compressed matrix in tests/data/kaldi, through DeviceCmDecoder's
// kernel (CmDecodeKernel, with its shared-memory table between barriers).
void ExpectCmDecoderMatchesTheCpu(const std::vector<CompressedJob>& jobs, uint64_t floats, const HostLaunch& launch) {
  std::vector<float> want(floats, 0.0f), got(floats);
  std::memset(got.data(), 0xFF, floats * sizeof(float));  // NaN: a value not written shows
  for (const CompressedJob& j : jobs) {
    kaldi::DecodeMatrix<float>(j.bytes, j.offset, j.info, {0, j.info.rows, 0, j.info.cols}, want.data() + j.out_offset);
  }
  absl::Status st = DecodeCmOnHost(jobs, got.data(), launch);
  ASSERT_TRUE(st.ok()) << st;
  size_t differ = 0;
  for (uint64_t i = 0; i < floats; ++i) differ += std::memcmp(&want[i], &got[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "of " << floats << " values";
}

TEST_P(HostKernels, RandomCompressedMatricesThroughTheCmDecoderKernelMatchTheCpuDecoder) {
  std::mt19937 rng(7);
  std::vector<std::string> objects;
  for (int format : {1, 2, 3}) {
    for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {1000, 40}, {3, 700}, {257, 13}, {5000, 1}}) {
      objects.push_back(conveyor::testing::RandomCompressed(format, rows, cols, rng));
    }
  }
  std::vector<CompressedJob> jobs;
  uint64_t floats = 0;
  for (const std::string& o : objects) {
    auto info = kaldi::ScanObject(o, 0, kaldi::ObjectKind::kMatrix);
    ASSERT_TRUE(info.ok()) << info.status();
    jobs.push_back({o, 0, *info, floats});
    floats += static_cast<uint64_t>(info->rows * info->cols);
  }
  ExpectCmDecoderMatchesTheCpu(jobs, floats, launch());
}

TEST_P(HostKernels, TestdataCompressedMatricesThroughTheCmDecoderKernelMatchTheCpuDecoder) {
  const std::string dir = conveyor::testing::TestdataDir() + "/kaldi";
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  std::vector<std::unique_ptr<kaldi::KaldiTable>> tables;
  std::vector<CompressedJob> jobs;
  uint64_t floats = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("cm", 0) != 0 || f.path().extension() != ".ark") continue;
    kaldi::TableOptions options;
    options.tolerate = [](const std::string&) { return true; };
    auto table = kaldi::KaldiTable::Open("ark:" + f.path().string(), options);
    ASSERT_TRUE(table.ok()) << table.status();
    for (const kaldi::TableEntry& e : (*table)->entries()) {
      const auto t = e.info.type;
      if (t != kaldi::ObjectType::kCompressed1 && t != kaldi::ObjectType::kCompressed2 &&
          t != kaldi::ObjectType::kCompressed3) {
        continue;
      }
      jobs.push_back({(*table)->bytes(e.source), e.offset, e.info, floats});
      floats += static_cast<uint64_t>(e.info.rows * e.info.cols);
    }
    tables.push_back(std::move(*table));
  }
  ASSERT_GT(jobs.size(), 10u);
  ExpectCmDecoderMatchesTheCpu(jobs, floats, launch());
}

// The Kaldi archives through the pipelined loader (fences: two batches in flight), left
// compressed: CM, CM2, CM3, an scp range, utterances and frames, float and double.
TEST_P(HostKernels, CompressedKaldiArchivesThroughTheLoaderMatchTheCpuLoader) {
  ProgramStats stats;
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler(launch(), &stats));
  conveyor::testing::ExpectCompressedKaldiMatchesTheCpuLoader(host.get(), MemoryKind::kHost);
  host.reset();  // its worker has finished with `stats`
  EXPECT_GT(stats.decode_ops, 0u);
}

// HTK features left in their files through the pipelined loader: the program sends the frames
// as they lie and its frames ops build the windows, bit for bit as the CPU assembler does.
TEST_P(HostKernels, HtkFramesThroughTheLoaderMatchTheCpuLoader) {
  ProgramStats stats;
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler(launch(), &stats));
  conveyor::testing::ExpectHtkFramesMatchTheCpuLoader(host.get(), MemoryKind::kHost);
  host.reset();
  EXPECT_EQ(stats.decode_ops, 0u);  // no Kaldi matrix among them
  EXPECT_GT(stats.frames_ops, 100u) << "the frames ops did not run";
}

TEST_P(HostKernels, SparseCtfThroughTheLoaderMatchesTheCpuLoader) {
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler(launch()));
  conveyor::testing::ExpectPipelinedLoaderMatchesTheCpuLoader(conveyor::testing::CtfConfig(), {},
                                                              conveyor::testing::Randomized(64, false), host.get(),
                                                              MemoryKind::kHost);
}

// CBF in ctf2bin's layout, whose sparse entries the chunks leave where they lie in the file:
// the program packs them from there (CNTK's jagged sparse sequences, utterances and frames).
TEST_P(HostKernels, SparseCbfEntriesInPlaceThroughTheLoaderMatchTheCpuLoader) {
  const std::string path = std::string(CONVEYOR_TESTDATA_DIR) + "/cntk/CNTKBinaryReader/Data/50x20_jagged_sequences_sparse.bin";
  for (const char* precision : {"float", "double"}) {
    auto config = ParseConfig(std::string("datasets:\n  d:\n    precision: ") + precision +
                                  "\n    deserializers:\n      - type: CNTKBinary\n        file: " + path + "\n",
                              "test", "/");
    ASSERT_TRUE(config.ok()) << config.status();
    if (!Dataset::Open(config->datasets[0]).ok()) continue;  // the file's precision is the other
    for (bool frames : {false, true}) {
      SCOPED_TRACE(::testing::Message() << precision << (frames ? " frames" : " sequences"));
      auto host = MakePipelinedAssembler(MakeHostProgramAssembler(launch()));
      conveyor::testing::ExpectPipelinedLoaderMatchesTheCpuLoader(config->datasets[0], {},
                                                                  conveyor::testing::Randomized(16, frames), host.get(),
                                                                  MemoryKind::kHost);
    }
    return;
  }
  FAIL() << "opens as neither float nor double: " << path;
}

// int64 colptr (a CSC stream past INT32_MAX entries, too large to generate): a program made
// by hand, 3 columns of 2, 0 and 3 entries, the second piece split in two ops.
TEST_P(HostKernels, CscPiecesWithAnInt64ColptrLandWhereItSays) {
  AssemblyProgram prog;
  prog.value_bytes = 4;
  const uint64_t colptr = 0, rowind = 64, values = 128;
  prog.slot_bytes = 192;
  const int64_t counts[4] = {2, 0, 3, 0};
  const int32_t rows[5] = {7, 1, 4, 4, 9};
  const float vals[5] = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f};
  prog.host_arrays.resize(128);
  std::memcpy(prog.host_arrays.data(), counts, sizeof(counts));
  std::memcpy(prog.host_arrays.data() + 64, rows, sizeof(rows));
  std::memcpy(prog.host_arrays.data() + 96, vals, sizeof(vals));
  prog.scans.push_back({0, 3, colptr, 1, 0});
  CscPieceOp op;
  op.colptr = colptr, op.rowind = rowind, op.values = values, op.wide = 1;
  op.src_rowind = 64, op.src_values = 96, op.nnz = 2, op.first_col = 0;
  prog.csc_pieces.push_back(op);
  op.src_rowind = 64 + 8, op.src_values = 96 + 8, op.nnz = 2, op.first_col = 1;  // entries 0-1 of piece 2
  prog.csc_pieces.push_back(op);
  op.src_rowind += 8, op.src_values += 8, op.nnz = 1, op.skip = 2;  // its entry 2
  prog.csc_pieces.push_back(op);
  prog.payload_bytes = prog.csc_pieces_at = 128;
  prog.scatters_at = prog.decodes_at = prog.staging_bytes = 128 + 3 * sizeof(CscPieceOp);
  std::vector<std::byte> staging(prog.staging_bytes + 16), slot(prog.slot_bytes, std::byte{0xAB});
  std::byte* at = staging.data() + (16 - reinterpret_cast<uintptr_t>(staging.data()) % 16) % 16;
  PackStaging(prog, at);
  RunProgramOnHost(prog, at, nullptr, slot.data(), launch());
  int64_t got_colptr[4];
  int32_t got_rows[5];
  float got_vals[5];
  std::memcpy(got_colptr, slot.data() + colptr, sizeof(got_colptr));
  std::memcpy(got_rows, slot.data() + rowind, sizeof(got_rows));
  std::memcpy(got_vals, slot.data() + values, sizeof(got_vals));
  EXPECT_EQ(std::vector<int64_t>(got_colptr, got_colptr + 4), (std::vector<int64_t>{0, 2, 2, 5}));
  EXPECT_EQ(std::vector<int32_t>(got_rows, got_rows + 5), std::vector<int32_t>(rows, rows + 5));
  EXPECT_EQ(std::vector<float>(got_vals, got_vals + 5), std::vector<float>(vals, vals + 5));
}

// Every standard case begun at once through the pipelined host program, each fence then the
// CPU's bytes.
TEST_P(HostKernels, EveryCaseBegunAtOnceCompletesAtItsFence) {
  auto host = MakePipelinedAssembler(MakeHostProgramAssembler(launch()));
  auto cpu = MakeCpuAssembler();
  std::vector<conveyor::testing::BatchCase> cases;
  std::vector<BatchPlan> plans;
  std::vector<std::vector<std::byte>> got, want;
  for (const auto& spec : conveyor::testing::StandardCases()) {
    cases.push_back(conveyor::testing::MakeBatchCase(spec, 500 + cases.size()));
    auto plan = PlanBatch(cases.back().streams, spec.precision, cases.back().shape, cases.back().pieces,
                          cases.back().layouts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plans.push_back(std::move(*plan));
  }
  got.resize(plans.size());
  std::vector<uint64_t> fences;
  for (size_t i = 0; i < plans.size(); ++i) {
    got[i].assign(plans[i].total_bytes, std::byte{0xAB});
    auto fence = host->Begin(plans[i], cases[i].pieces, absl::MakeSpan(got[i]));
    ASSERT_TRUE(fence.ok()) << fence.status();
    fences.push_back(*fence);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE(cases[i].spec.name);
    ASSERT_TRUE(host->Wait(fences[i]).ok());
    std::vector<std::byte> w(plans[i].total_bytes);
    ASSERT_TRUE(cpu->Assemble(plans[i], cases[i].pieces, absl::MakeSpan(w)).ok());
    ExpectSameBytes(got[i], w);
  }
}

}  // namespace
}  // namespace conveyor::gpu

namespace conveyor::gpu {
namespace {

// Per stream of `c`: float16 for even streams, bfloat16 for odd ones (ids keep int32).
std::vector<DType> Narrowed(const conveyor::testing::BatchCase& c) {
  std::vector<DType> out;
  for (size_t s = 0; s < c.streams.size(); ++s) {
    out.push_back(c.streams[s].format == StreamFormat::kIds ? DType::kFloat32
                                                            : (s % 2 == 0 ? DType::kFloat16 : DType::kBFloat16));
  }
  return out;
}

// The CPU assembler's narrowed batch, checked against its own float32 batch independently of
// the narrowing code: every array but the values byte for byte, the values converted one by
// one with half.h, and every other byte zero.
// The NaN bits FramesKernel writes are x86's (the CPU decoder's), written out by hand: the
// device's own arithmetic would give its canonical NaN instead, which only a GPU run shows, so
// the rules are pinned here against their definition.
TEST(HtkNaNs, CompressedValuesAndWideningGiveTheBitsTheCpuDecoderGives) {
  auto bits = [](float f) { return FloatBits(f); };
#if defined(__x86_64__)
  const uint32_t default_nan = 0xffc00000u;
#elif defined(__aarch64__)
  const uint32_t default_nan = 0x7fc00000u;
#else
  const uint32_t default_nan = HostDefaultNan();
#endif
  EXPECT_EQ(HostDefaultNan(), default_nan);
  const uint32_t dn = HostDefaultNan();
  EXPECT_EQ(bits(HtkCompressedValue(0, 0.0f, 0.0f, dn)), default_nan);                  // 0/0
  EXPECT_EQ(bits(HtkCompressedValue(3, 0.0f, 0.0f, dn)), 0x7f800000u);                  // 3/0: +inf, no NaN
  EXPECT_EQ(bits(HtkCompressedValue(-3, 0.0f, 0.0f, dn)), 0xff800000u);
  EXPECT_EQ(bits(HtkCompressedValue(5, BitsFloat(0x7fc00abcu), 1.0f, dn)), 0x7fc00abcu);  // A's NaN
  EXPECT_EQ(bits(HtkCompressedValue(5, BitsFloat(0x7f800abcu), 1.0f, dn)), 0x7fc00abcu);  // quieted
  EXPECT_EQ(bits(HtkCompressedValue(5, 2.0f, BitsFloat(0xff800123u), dn)), 0xffc00123u);  // B's, quieted
  // Both NaN: the first operand's, (x + B)'s.
  EXPECT_EQ(bits(HtkCompressedValue(5, BitsFloat(0x7fc00abcu), BitsFloat(0x7fc00001u), dn)), 0x7fc00001u);
  EXPECT_EQ(HtkCompressedValue(5, 2.0f, 1.0f, dn), 3.0f);
  EXPECT_EQ(HtkCompressedValue(-15000, 7.25f, 1000.37f, dn), (-15000.0f + 1000.37f) / 7.25f);
  auto wide = [](float f) {
    const double d = WidenFloat<double>(f);
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
  };
  EXPECT_EQ(wide(BitsFloat(0x7f800001u)), 0x7ff8000020000000ull);  // signalling: quieted, payload kept
  EXPECT_EQ(wide(BitsFloat(0xffc12345u)), 0xfff82468a0000000ull);
  EXPECT_EQ(wide(1.5f), 0x3ff8000000000000ull);
  EXPECT_EQ(FloatBits(WidenFloat<float>(BitsFloat(0x7f800001u))), 0x7f800001u);  // float: moved as is
}

TEST(NarrowedValues, TheCpuAssemblerConvertsEachValueOfTheFloat32Batch) {
  uint64_t checked = 0;
  for (const auto& spec : conveyor::testing::StandardCases()) {
    if (spec.precision != Precision::kFloat) continue;
    SCOPED_TRACE(spec.name);
    auto c = conveyor::testing::MakeBatchCase(spec, 31);
    auto native = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    auto narrow = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts, Narrowed(c));
    ASSERT_TRUE(native.ok() && narrow.ok()) << native.status() << narrow.status();
    std::vector<std::byte> want(native->total_bytes), got(narrow->total_bytes, std::byte{0xAB});
    ASSERT_TRUE(MakeCpuAssembler()->Assemble(*native, c.pieces, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(MakeCpuAssembler()->Assemble(*narrow, c.pieces, absl::MakeSpan(got)).ok());
    std::vector<bool> covered(got.size(), false);
    auto same = [&](const ArrayDesc& from, const ArrayDesc& to) {
      if (!to.present()) return;
      ASSERT_EQ(from.bytes, to.bytes);
      if (to.bytes == 0) return;  // (an empty batch's arrays: no memory to compare)
      EXPECT_EQ(std::memcmp(want.data() + from.offset, got.data() + to.offset, to.bytes), 0);
      for (uint64_t i = 0; i < to.bytes; ++i) covered[to.offset + i] = true;
    };
    same(native->mask, narrow->mask);
    same(native->flags, narrow->flags);
    for (size_t s = 0; s < narrow->streams.size(); ++s) {
      const StreamLayout& a = native->streams[s];
      const StreamLayout& b = narrow->streams[s];
      same(a.lengths, b.lengths);
      same(a.colptr, b.colptr);
      same(a.rowind, b.rowind);
      same(a.rowptr, b.rowptr);
      same(a.colind, b.colind);
      if (b.values.dtype != DType::kFloat16 && b.values.dtype != DType::kBFloat16) {
        same(a.values, b.values);
        continue;
      }
      ASSERT_EQ(a.values.bytes, 2 * b.values.bytes);
      for (uint64_t i = 0; i < b.values.bytes / 2; ++i) {
        float v;
        uint16_t h;
        std::memcpy(&v, want.data() + a.values.offset + 4 * i, 4);
        std::memcpy(&h, got.data() + b.values.offset + 2 * i, 2);
        ASSERT_EQ(h, b.values.dtype == DType::kFloat16 ? FloatToHalfBits(v) : FloatToBFloat16Bits(v)) << "value " << i;
        covered[b.values.offset + 2 * i] = covered[b.values.offset + 2 * i + 1] = true;
        ++checked;
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (!covered[i]) {
        ASSERT_EQ(got[i], std::byte{0}) << "gap byte " << i;
      }
    }
  }
  EXPECT_GT(checked, 100000u);
}

TEST_P(HostKernels, NarrowedValuesMatchTheCpuAssembler) {
  ProgramStats stats;
  for (const auto& spec : conveyor::testing::StandardCases()) {
    if (spec.precision != Precision::kFloat) continue;
    SCOPED_TRACE(spec.name);
    auto c = conveyor::testing::MakeBatchCase(spec, 32);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts, Narrowed(c));
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<std::byte> want(plan->total_bytes), got(plan->total_bytes, std::byte{0xAB});
    ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, c.pieces, absl::MakeSpan(want)).ok());
    absl::Status st = MakeHostProgramAssembler(launch(), &stats)->Assemble(*plan, c.pieces, absl::MakeSpan(got));
    ASSERT_TRUE(st.ok()) << st;
    ExpectSameBytes(got, want);
  }
  EXPECT_GT(stats.narrow_ops, 0u);
}

TEST(NarrowedValues, OnlyFloatValuesOfAFloatDatasetNarrow) {
  auto c = conveyor::testing::MakeBatchCase(conveyor::testing::StandardCases()[0], 1);
  std::vector<DType> ask(c.streams.size(), DType::kFloat16);
  auto dbl = PlanBatch(c.streams, Precision::kDouble, c.shape, c.pieces, c.layouts, ask);
  EXPECT_FALSE(dbl.ok());
  std::vector<DType> bad(c.streams.size(), DType::kInt64);
  EXPECT_FALSE(PlanBatch(c.streams, Precision::kFloat, c.shape, c.pieces, c.layouts, bad).ok());
  EXPECT_FALSE(CheckValueDType("ali", StreamFormat::kIds, Precision::kFloat, DType::kFloat16).ok());
  EXPECT_TRUE(CheckValueDType("x", StreamFormat::kSparse, Precision::kFloat, DType::kBFloat16).ok());
}

}  // namespace
}  // namespace conveyor::gpu
