// The CUDA assembler's host half: programs built from generated batches, run on the host,
// give exactly the CPU assembler's bytes (what the kernels must then reproduce on the
// device); copy items merge and split as promised; bad input is refused.
#include "cuda/assembly_program.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_object.h"
#include "gtest/gtest.h"
#include "tests/gpu/batch_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

using conveyor::testing::MakeBatchCase;
using conveyor::testing::StandardCases;

std::vector<std::byte> AssembleWith(BatchAssembler& assembler, const BatchPlan& plan, const std::vector<PieceRef>& pieces) {
  std::vector<std::byte> out(plan.total_bytes, std::byte{0xAB});  // garbage: every byte must be written
  absl::Status st = assembler.Assemble(plan, pieces, absl::MakeSpan(out));
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// A single-stream case of `rows` rows, planned.
struct Planned {
  conveyor::testing::BatchCase batch;
  BatchPlan plan;
};
Planned PlanOne(uint32_t rows, conveyor::testing::Mode mode, StreamFormat format, uint64_t dim) {
  conveyor::testing::CaseSpec spec;
  spec.rows = rows;
  spec.mode = mode;
  spec.streams = {{format, dim}};
  Planned p{MakeBatchCase(spec, 5), {}};
  auto plan = PlanBatch(p.batch.streams, spec.precision, p.batch.shape, p.batch.pieces, p.batch.layouts);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) p.plan = std::move(*plan);
  return p;
}

TEST(AssemblyProgram, HostRunEqualsTheCpuAssemblerOnEveryStandardCase) {
  auto cpu = MakeCpuAssembler();
  auto program = MakeHostProgramAssembler();
  for (const auto& spec : StandardCases()) {
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
      auto c = MakeBatchCase(spec, seed);
      auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<std::byte> want = AssembleWith(*cpu, *plan, c.pieces);
      const std::vector<std::byte> got = AssembleWith(*program, *plan, c.pieces);
      ASSERT_EQ(got.size(), want.size());
      size_t first = 0;
      while (first < want.size() && got[first] == want[first]) ++first;
      EXPECT_EQ(first, want.size()) << "first differing byte " << first << " of " << want.size();
    }
  }
}

TEST(AssemblyProgram, TheStandardCasesCoverWhatTheyClaim) {
  bool csc = false, csr = false, dense_sparse = false, ids = false, nnz0 = false, wide8192 = false, dim1e6 = false;
  for (const auto& spec : StandardCases()) {
    auto c = MakeBatchCase(spec, 1);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const StreamLayout& L : plan->streams) {
      csc |= L.csc();
      csr |= L.csr();
      ids |= L.ids();
      dense_sparse |= L.format == StreamFormat::kSparse && L.dense_values();
      nnz0 |= L.format == StreamFormat::kSparse && L.nnz == 0;
      dim1e6 |= L.dim >= 1000000;
    }
    wide8192 |= plan->shape.rows == 8192;
  }
  EXPECT_TRUE(csc && csr && dense_sparse && ids && nnz0 && wide8192 && dim1e6);
}

TEST(AssemblyProgram, ConsecutiveRowsOfDenseFramesBecomeOneCopy) {
  Planned p = PlanOne(100, conveyor::testing::Mode::kFrame, StreamFormat::kDense, 4);
  auto prog = BuildAssemblyProgram(p.plan, p.batch.pieces);
  ASSERT_TRUE(prog.ok()) << prog.status();
  // 100 rows x 16 bytes, staged 16-aligned back to back: one copy item.
  ASSERT_EQ(prog->copies.size(), 1u);
  EXPECT_EQ(prog->copies[0].bytes, 1600u);
  EXPECT_EQ(prog->copies[0].dst, p.plan.streams[0].values.offset);
}

TEST(AssemblyProgram, LongCopiesAreSplitIntoBoundedItems) {
  Planned p = PlanOne(1, conveyor::testing::Mode::kFrame, StreamFormat::kDense, 50000);  // 200,000 bytes
  auto prog = BuildAssemblyProgram(p.plan, p.batch.pieces);
  ASSERT_TRUE(prog.ok());
  ASSERT_EQ(prog->copies.size(), 4u);  // 3 x 64 KiB + the rest
  uint64_t total = 0;
  for (const CopyItem& it : prog->copies) {
    EXPECT_LE(it.bytes, kCopyItemBytes);
    total += it.bytes;
  }
  EXPECT_EQ(total, 200000u);
}

TEST(AssemblyProgram, RefusesPiecesThatAreNotThePlans) {
  Planned p = PlanOne(3, conveyor::testing::Mode::kSequence, StreamFormat::kDense, 2);
  std::vector<PieceRef> fewer(p.batch.pieces.begin(), p.batch.pieces.end() - 1);
  auto prog = BuildAssemblyProgram(p.plan, fewer);
  ASSERT_FALSE(prog.ok());
  EXPECT_EQ(prog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prog.status().message().find("3 pieces; 2 were given"), std::string::npos) << prog.status();
}

TEST(AssemblyProgram, HostProgramAssemblerRefusesASmallSlot) {
  Planned p = PlanOne(2, conveyor::testing::Mode::kSequence, StreamFormat::kDense, 2);
  std::vector<std::byte> small(p.plan.total_bytes - 1);
  absl::Status st = MakeHostProgramAssembler()->Assemble(p.plan, p.batch.pieces, absl::MakeSpan(small));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the slot has"), std::string::npos) << st;
}

}  // namespace
}  // namespace conveyor::gpu

namespace conveyor::gpu {
namespace {

// Frames 3..10 of a CM matrix (tests/data/kaldi/cm_auto.ark, first entry) in rows 0..7 become one
// decode op (one column-header block, eight-byte column runs); a gap starts another, and a
// run shorter than kCm1DeviceMinRows is decoded on the host. Both programs, run on the host,
// give the CPU decoder's bytes.
TEST(AssemblyProgram, ConsecutiveFramesOfACompressedMatrixBecomeOneDecodeOp) {
  std::ifstream in(conveyor::testing::TestdataDir() + "/kaldi/cm_auto.ark", std::ios::binary);
  const std::string ark((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(ark.size(), 14u);
  auto info = kaldi::ScanObject(ark, 14, kaldi::ObjectKind::kMatrix);  // after "spk01-utt0001 "
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->type, kaldi::ObjectType::kCompressed1);
  ASSERT_GT(info->rows, 18);
  ParsedChunk chunk;
  chunk.keys = {1};
  chunk.lengths = {static_cast<uint32_t>(info->rows)};
  chunk.slot_of = {0};
  ParsedStream ps;
  ps.format = StreamFormat::kDense;
  ps.dim = static_cast<uint32_t>(info->cols);
  ps.sequence_begin = {0, static_cast<uint64_t>(info->rows)};
  ps.compressed = {CompressedDense{ark.data() + 14, *info, 0, 0}};
  chunk.streams = {ps};
  const std::vector<StreamConfig> streams = {{"f", "f", StreamFormat::kDense, static_cast<uint64_t>(info->cols), false}};
  for (const std::vector<uint32_t>& frames : {std::vector<uint32_t>{3, 4, 5, 6, 7, 8, 9, 10}, std::vector<uint32_t>{3, 4, 5, 6, 9, 10, 11, 12, 18}}) {
    std::vector<PieceRef> pieces;
    for (uint32_t f : frames) {
      PieceRef r;
      r.chunk = &chunk;
      r.sample_begin = f;
      r.sample_count = 1;
      r.row = static_cast<uint32_t>(pieces.size());
      r.frame = f;
      pieces.push_back(r);
    }
    BatchShape shape;
    shape.rows = static_cast<uint32_t>(pieces.size());
    shape.frame_mode = true;
    auto plan = PlanBatch(streams, Precision::kFloat, shape, pieces);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto prog = BuildAssemblyProgram(*plan, pieces);
    ASSERT_TRUE(prog.ok()) << prog.status();
    if (frames.size() == 8) {
      ASSERT_EQ(prog->decodes.size(), 1u);
      EXPECT_EQ(prog->decodes[0].rows, 8u);
      EXPECT_TRUE(prog->host_decoded.empty());
    } else {
      ASSERT_EQ(prog->decodes.size(), 2u);  // 3-6 and 9-12 on the device, 18 on the host
      EXPECT_EQ(prog->decodes[0].rows, 4u);
      EXPECT_EQ(prog->decodes[1].rows, 4u);
      EXPECT_EQ(prog->host_decoded.size(), 1u);
    }
    auto cpu = MakeCpuAssembler();
    auto host = MakeHostProgramAssembler();
    EXPECT_EQ(AssembleWith(*host, *plan, pieces), AssembleWith(*cpu, *plan, pieces));
    // And those are the decoder's values for those rows.
    std::vector<float> want(frames.size() * ps.dim);
    for (size_t i = 0; i < frames.size(); ++i) {
      kaldi::DecodeMatrix<float>(ark, 14, *info, {frames[i], 1, 0, info->cols}, want.data() + i * ps.dim);
    }
    const std::vector<std::byte> got = AssembleWith(*host, *plan, pieces);
    EXPECT_EQ(std::memcmp(got.data() + plan->streams[0].values.offset, want.data(), want.size() * 4), 0);
  }
}

}  // namespace
}  // namespace conveyor::gpu
