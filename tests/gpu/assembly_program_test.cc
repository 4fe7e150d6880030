// The CUDA assembler's host half: programs built from generated batches, run on the host
// (the kernels' code on the host executor), give exactly the CPU assembler's bytes; copy
// items merge and split as promised, long pieces, samples and decode runs are split into
// bounded ops, CSR transposes take as many radix passes as their rows need; bad input is
// refused.
#include "cuda/assembly_program.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_object.h"
#include "gtest/gtest.h"
#include "cuda/host_program.h"
#include "cuda/cases/batch_cases.h"
#include "cuda/cases/compressed_cases.h"
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

// The standard cases that exist to split work (batch_cases.cc) do: bounded ops, covering
// each piece or sample exactly, and CSR transposes with 0 to 3 radix passes.
TEST(AssemblyProgram, LongPiecesAndSamplesBecomeBoundedOpsAndCsrRowsTheirRadixPasses) {
  bool split_piece = false, banded = false;
  uint32_t most_passes = 0, fewest_passes = 99;
  for (const auto& spec : StandardCases()) {
    auto c = MakeBatchCase(spec, 1);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto prog = BuildAssemblyProgram(*plan, c.pieces);
    ASSERT_TRUE(prog.ok()) << prog.status();
    for (size_t i = 0; i < prog->csc_pieces.size(); ++i) {
      const CscPieceOp& op = prog->csc_pieces[i];
      EXPECT_LE(op.nnz, kCscPieceEntries);
      if (op.skip > 0) {
        split_piece = true;
        ASSERT_GT(i, 0u);
        const CscPieceOp& prev = prog->csc_pieces[i - 1];  // the piece's previous part, just before
        EXPECT_EQ(prev.skip + prev.nnz, op.skip);
        EXPECT_EQ(prev.first_col, op.first_col);
        EXPECT_EQ(prev.src_rowind + prev.nnz * 4, op.src_rowind);
      }
    }
    for (const ScatterOp& op : prog->scatters) {
      EXPECT_LT(op.band, op.bands);
      EXPECT_LE(op.bands, kMaxScatterBands);
      banded |= op.bands > 1;
    }
    for (const TransposeOp& tr : prog->transposes) {
      most_passes = std::max(most_passes, tr.passes);
      fewest_passes = std::min(fewest_passes, tr.passes);
      EXPECT_GE(uint64_t{1} << (kRadixBits * tr.passes), tr.dim) << spec.name;
    }
  }
  EXPECT_TRUE(split_piece);
  EXPECT_TRUE(banded);
  EXPECT_EQ(most_passes, 3u);
  EXPECT_EQ(fewest_passes, 0u);
}

// A CM (column headers) and a CM2 utterance of 1000 x 40: bands of kDecodeOpValues values,
// sharing the CM's staged columns, covering every row once.
TEST(AssemblyProgram, LongDecodeRunsBecomeBandsOfRows) {
  std::mt19937 rng(3);
  for (int format : {1, 2}) {
    auto c = conveyor::testing::MakeCompressedCase({conveyor::testing::RandomCompressed(format, 1000, 40, rng)}, 0, 0,
                                                   40, conveyor::testing::CompressedPieces::kUtterances, 1);
    auto plan = PlanBatch(c.streams, Precision::kFloat, c.shape, c.pieces);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto prog = BuildAssemblyProgram(*plan, c.pieces);
    ASSERT_TRUE(prog.ok()) << prog.status();
    ASSERT_EQ(prog->decodes.size(), 3u);  // 409 + 409 + 182 rows
    uint32_t rows = 0;
    for (const DecodeOp& op : prog->decodes) {
      EXPECT_LE(uint64_t{op.rows} * op.cols, kDecodeOpValues);
      EXPECT_EQ(op.dst, prog->decodes[0].dst + uint64_t{rows} * 40 * 4);
      if (format == 1) {
        EXPECT_EQ(op.row0, rows);
        EXPECT_EQ(op.column_rows, 1000u);
        EXPECT_EQ(op.src, prog->decodes[0].src);
      } else {
        EXPECT_EQ(op.src, prog->decodes[0].src + uint64_t{rows} * 40 * 2);
      }
      rows += op.rows;
    }
    EXPECT_EQ(rows, 1000u);
  }
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

// Rows the program decodes on the host, in packs.
size_t DecodedOnTheHost(const AssemblyProgram& prog) {
  return static_cast<size_t>(std::count_if(prog.packs.begin(), prog.packs.end(), [](const HostPack& p) { return p.decode != nullptr; }));
}

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
      EXPECT_EQ(DecodedOnTheHost(*prog), 0u);
    } else {
      ASSERT_EQ(prog->decodes.size(), 2u);  // 3-6 and 9-12 on the device, 18 on the host
      EXPECT_EQ(prog->decodes[0].rows, 4u);
      EXPECT_EQ(prog->decodes[1].rows, 4u);
      EXPECT_EQ(DecodedOnTheHost(*prog), 1u);
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
