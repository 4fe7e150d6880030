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
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/formats/htk/htk_features.h"
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

// Frames `frames` of the one sequence of `chunk`, a row each (frame mode), and their batch shape.
std::vector<PieceRef> FramePieces(const ParsedChunk* chunk, const std::vector<uint32_t>& frames) {
  std::vector<PieceRef> pieces;
  for (uint32_t f : frames) {
    PieceRef r;
    r.chunk = chunk;
    r.sample_begin = f;
    r.sample_count = 1;
    r.row = static_cast<uint32_t>(pieces.size());
    r.frame = f;
    pieces.push_back(r);
  }
  return pieces;
}
BatchShape FrameShape(const std::vector<PieceRef>& pieces) {
  BatchShape shape;
  shape.rows = static_cast<uint32_t>(pieces.size());
  shape.frame_mode = true;
  return shape;
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
    const std::vector<PieceRef> pieces = FramePieces(&chunk, frames);
    auto plan = PlanBatch(streams, Precision::kFloat, FrameShape(pieces), pieces);
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

// A compressed matrix whose values could come out NaN (a non-finite header, or percentiles
// that overflow) is decoded on the host, whose NaN bits are the CPU decoder's: the device
// would write its own canonical NaN. Finite headers go to the device as before.
TEST(AssemblyProgram, CompressedMatricesWithNonFiniteHeadersAreDecodedOnTheHost) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int format : {1, 2, 3}) {
    for (auto [min_value, range, device] : {std::make_tuple(-3.0f, 7.0f, true), std::make_tuple(nan, 7.0f, false),
                                            std::make_tuple(-3.0f, inf, false), std::make_tuple(-inf, 7.0f, false),
                                            std::make_tuple(3e38f, 3e38f, false), std::make_tuple(-5e37f, 5e37f, true)}) {
      SCOPED_TRACE(::testing::Message() << "CM" << format << " min " << min_value << " range " << range);
      std::mt19937 rng(11);
      std::string object = conveyor::testing::RandomCompressed(format, 8, 5, rng);
      const size_t header = format == 1 ? 5 : 6;  // after "\0BCM " / "\0BCM2 "
      std::memcpy(&object[header], &min_value, 4);
      std::memcpy(&object[header + 4], &range, 4);
      auto c = conveyor::testing::MakeCompressedCase({object}, 0, 0, 5, conveyor::testing::CompressedPieces::kUtterances, 1);
      auto plan = PlanBatch(c.streams, Precision::kFloat, c.shape, c.pieces);
      ASSERT_TRUE(plan.ok()) << plan.status();
      auto prog = BuildAssemblyProgram(*plan, c.pieces);
      ASSERT_TRUE(prog.ok()) << prog.status();
      EXPECT_EQ(prog->decodes.size(), device ? 1u : 0u);
      EXPECT_EQ(DecodedOnTheHost(*prog), device ? 0u : 1u);
      auto host = MakeHostProgramAssembler();
      auto cpu = MakeCpuAssembler();
      EXPECT_EQ(AssembleWith(*host, *plan, c.pieces), AssembleWith(*cpu, *plan, c.pieces));
    }
  }
}

// An HTK utterance left in its (big-endian) file, context window [2, 2], 3 values a frame:
// value j of frame f is 10 f + j. Staged bytes: what the program sends of the file's frames.
struct HtkUtterance {
  static constexpr int kFrames = 20, kDim = 3, kLeft = 2, kRight = 2;
  std::string file;
  ParsedChunk chunk;
  std::vector<StreamConfig> streams;

  explicit HtkUtterance(int left = kLeft, int right = kRight) {
    auto put32 = [&](uint32_t u) {
      u = __builtin_bswap32(u);
      file.append(reinterpret_cast<const char*>(&u), 4);
    };
    put32(kFrames);
    put32(100000);
    const uint16_t tail[2] = {__builtin_bswap16(4 * kDim), __builtin_bswap16(9)};
    file.append(reinterpret_cast<const char*>(tail), 4);
    for (int f = 0; f < kFrames; ++f) {
      for (int j = 0; j < kDim; ++j) {
        const float v = static_cast<float>(10 * f + j);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        put32(u);
      }
    }
    HtkFramesPayload p;
    p.first = 12;
    p.frames = kFrames;
    p.dim = kDim;
    p.left = left;
    p.right = right;
    CompressedDense m;
    m.object = file.data();
    m.info.codec = HtkFramesCodecTag();
    m.info.Store(p);
    const uint32_t row_values = kDim * (left + 1 + right);
    chunk.keys = {1};
    chunk.lengths = {kFrames};
    chunk.slot_of = {0};
    ParsedStream ps;
    ps.format = StreamFormat::kDense;
    ps.dim = row_values;
    ps.sequence_begin = {0, kFrames};
    ps.compressed = {m};
    chunk.streams = {ps};
    streams = {{"x", "x", StreamFormat::kDense, row_values, false}};
  }
  // What the program sends of the file: its packs' bytes (rows decoded here included).
  static uint64_t Staged(const AssemblyProgram& prog) {
    uint64_t n = 0;
    for (const HostPack& p : prog.packs) n += p.bytes;
    return n;
  }
  // Row t of the windows: frames t - left .. t + right, the edges repeated.
  static std::vector<float> Row(int t) {
    std::vector<float> row;
    for (int f = t - kLeft; f <= t + kRight; ++f) {
      for (int j = 0; j < kDim; ++j) row.push_back(static_cast<float>(10 * std::min(std::max(f, 0), kFrames - 1) + j));
    }
    return row;
  }
};

// A whole utterance: its 20 frames sent once (240 bytes, not 20 rows of 5 frames: 1200), one
// frames op; the rows are the hand-computed windows, as the CPU assembler writes them.
TEST(AssemblyProgram, HtkUtterancesSendTheirFramesOnceAndTheDeviceBuildsTheWindows) {
  HtkUtterance u;
  PieceRef r;
  r.chunk = &u.chunk;
  BatchShape shape;
  shape.rows = 1;
  const std::vector<PieceRef> pieces = {r};
  auto plan = PlanBatch(u.streams, Precision::kFloat, shape, pieces);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto prog = BuildAssemblyProgram(*plan, pieces);
  ASSERT_TRUE(prog.ok()) << prog.status();
  ASSERT_EQ(prog->frames.size(), 1u);
  EXPECT_EQ(prog->frames[0].rows, 20u);
  EXPECT_EQ(DecodedOnTheHost(*prog), 0u);
  EXPECT_EQ(HtkUtterance::Staged(*prog), 20u * HtkUtterance::kDim * 4);
  std::vector<float> want;
  for (int t = 0; t < HtkUtterance::kFrames; ++t) {
    const std::vector<float> row = HtkUtterance::Row(t);
    want.insert(want.end(), row.begin(), row.end());
  }
  auto host = MakeHostProgramAssembler();
  auto cpu = MakeCpuAssembler();
  const std::vector<std::byte> got = AssembleWith(*host, *plan, pieces);
  EXPECT_EQ(got, AssembleWith(*cpu, *plan, pieces));
  ASSERT_EQ(plan->streams[0].values.bytes, want.size() * 4);
  EXPECT_EQ(std::memcmp(got.data() + plan->streams[0].values.offset, want.data(), want.size() * 4), 0);

  // Without a window the frames are the rows: decoded here, a copy item instead of an 80-byte
  // frames op.
  HtkUtterance plain(0, 0);
  PieceRef q;
  q.chunk = &plain.chunk;
  const std::vector<PieceRef> one = {q};
  auto plan0 = PlanBatch(plain.streams, Precision::kFloat, shape, one);
  ASSERT_TRUE(plan0.ok()) << plan0.status();
  auto prog0 = BuildAssemblyProgram(*plan0, one);
  ASSERT_TRUE(prog0.ok()) << prog0.status();
  EXPECT_TRUE(prog0->frames.empty());
  EXPECT_EQ(DecodedOnTheHost(*prog0), 1u);
  EXPECT_EQ(AssembleWith(*host, *plan0, one), AssembleWith(*cpu, *plan0, one));
}

// Frames 3..10 in rows 0..7 (frame mode) become one frames op over frames 1..12, sent once; a
// lone frame's window (18) is decoded here: its 5 frames and an op would send more than its
// row and a copy item.
TEST(AssemblyProgram, ConsecutiveHtkFramesBecomeOneFramesOpALoneFrameIsDecodedHere) {
  HtkUtterance u;
  const std::vector<PieceRef> pieces = FramePieces(&u.chunk, {3, 4, 5, 6, 7, 8, 9, 10, 18});
  auto plan = PlanBatch(u.streams, Precision::kFloat, FrameShape(pieces), pieces);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto prog = BuildAssemblyProgram(*plan, pieces);
  ASSERT_TRUE(prog.ok()) << prog.status();
  ASSERT_EQ(prog->frames.size(), 1u);
  EXPECT_EQ(prog->frames[0].rows, 8u);
  EXPECT_EQ(prog->frames[0].first, 1);
  EXPECT_EQ(DecodedOnTheHost(*prog), 1u);
  // Frames 1..12, then frame 18's row decoded (15 values).
  EXPECT_EQ(HtkUtterance::Staged(*prog), (12u + 5u) * HtkUtterance::kDim * 4);
  std::vector<float> want;
  for (uint32_t f : {3, 4, 5, 6, 7, 8, 9, 10, 18}) {
    const std::vector<float> row = HtkUtterance::Row(static_cast<int>(f));
    want.insert(want.end(), row.begin(), row.end());
  }
  auto host = MakeHostProgramAssembler();
  auto cpu = MakeCpuAssembler();
  const std::vector<std::byte> got = AssembleWith(*host, *plan, pieces);
  EXPECT_EQ(got, AssembleWith(*cpu, *plan, pieces));
  EXPECT_EQ(std::memcmp(got.data() + plan->streams[0].values.offset, want.data(), want.size() * 4), 0);
}

}  // namespace
}  // namespace conveyor::gpu
