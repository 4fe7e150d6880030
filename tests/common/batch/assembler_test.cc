// Batch layout and the CPU reference assembler, against hand-computed batches.
#include <cstring>
#include <vector>

#include "common/batch/assembler.h"
#include "common/batch/batch_layout.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

// Two sequences: lengths 2 and 1; dense dim 2 and sparse dim 10.
ParsedChunk MakeChunk() {
  ParsedChunk c;
  c.keys = {7, 9};
  c.lengths = {2, 1};
  c.slot_of = {0, 1};
  ParsedStream d;
  d.format = StreamFormat::kDense;
  d.dim = 2;
  d.sequence_begin = {0, 2, 3};
  d.values_f32 = {1, 2, 3, 4, 5, 6};
  ParsedStream s;
  s.format = StreamFormat::kSparse;
  s.dim = 10;
  s.sequence_begin = {0, 2, 3};
  s.nnz_begin = {0, 2, 2, 3};  // sample 0: two entries, sample 1: none, sample 2: one
  s.indices = {9, 1, 4};
  s.values_f32 = {0.5f, 1.5f, 2.5f};
  c.streams = {d, s};
  return c;
}

PieceRef Ref(const ParsedChunk* c, uint32_t slot, uint32_t row) {
  PieceRef r;
  r.chunk = c;
  r.slot = slot;
  r.row = row;
  return r;
}

BatchShape Shape(uint32_t rows, bool frame_mode) {
  BatchShape s;
  s.rows = rows;
  s.frame_mode = frame_mode;
  return s;
}

std::vector<StreamConfig> Streams() {
  return {{"d", "d", StreamFormat::kDense, 2, false}, {"s", "s", StreamFormat::kSparse, 10, false}};
}

template <typename T>
std::vector<T> Read(const std::vector<std::byte>& buf, const ArrayDesc& a) {
  std::vector<T> out(a.bytes / sizeof(T));
  std::memcpy(out.data(), buf.data() + a.offset, a.bytes);
  return out;
}

TEST(BatchLayout, SequenceModePadsAndAligns) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0), Ref(&c, 1, 1)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(2, false), refs);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_sequences, 2u);
  EXPECT_EQ(plan->num_samples, 3u);
  EXPECT_EQ(plan->pieces[0].key, 7u);
  EXPECT_EQ(plan->pieces[1].key, 9u);
  const StreamLayout& d = plan->streams[0];
  EXPECT_EQ(d.values.shape, (std::vector<uint64_t>{2, 2, 2}));
  const StreamLayout& s = plan->streams[1];
  EXPECT_EQ(s.colptr.shape, (std::vector<uint64_t>{5}));
  EXPECT_EQ(s.nnz, 3u);
  for (const StreamLayout& L : plan->streams)
    for (const ArrayDesc* a : {&L.lengths, &L.values, &L.colptr, &L.rowind})
      if (a->present()) {
        EXPECT_EQ(a->offset % kArrayAlignment, 0u);
      }
  EXPECT_EQ(plan->total_bytes % kArrayAlignment, 0u);

  std::vector<std::byte> buf(plan->total_bytes, std::byte{0xAB});
  auto cpu = MakeCpuAssembler();
  ASSERT_TRUE(cpu->Assemble(*plan, refs, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(Read<int32_t>(buf, d.lengths), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(Read<float>(buf, d.values), (std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0}));
  EXPECT_EQ(Read<int32_t>(buf, s.lengths), (std::vector<int32_t>{2, 1}));
  // Columns (seq, step): (0,0)=2 entries, (0,1)=0, (1,0)=1, (1,1)=padding.
  EXPECT_EQ(Read<int32_t>(buf, s.colptr), (std::vector<int32_t>{0, 2, 2, 3, 3}));
  EXPECT_EQ(Read<int32_t>(buf, s.rowind), (std::vector<int32_t>{9, 1, 4}));
  EXPECT_EQ(Read<float>(buf, s.values), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  // Every byte is defined: gaps are zero, not the 0xAB fill.
  for (size_t i = s.values.offset + s.values.bytes; i < buf.size(); ++i) ASSERT_EQ(buf[i], std::byte{0}) << i;
  for (size_t i = d.lengths.offset + d.lengths.bytes; i < d.values.offset; ++i) ASSERT_EQ(buf[i], std::byte{0}) << i;
}

TEST(BatchLayout, FrameModeHasNoTimeAxis) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 1, 0)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(1, true), refs);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->streams[0].lengths.present());
  EXPECT_EQ(plan->streams[0].values.shape, (std::vector<uint64_t>{1, 2}));
  std::vector<std::byte> buf(plan->total_bytes);
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(Read<float>(buf, plan->streams[0].values), (std::vector<float>{5, 6}));
  EXPECT_EQ(Read<int32_t>(buf, plan->streams[1].colptr), (std::vector<int32_t>{0, 1}));
}

TEST(BatchLayout, FrameModeRefusesLongerSequences) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(1, true), refs);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("frame mode: sequence 7 has 2 samples"), std::string::npos) << plan.status();
}

TEST(BatchLayout, AssemblerRefusesASmallSlot) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(1, false), refs);
  std::vector<std::byte> buf(plan->total_bytes - 1);
  EXPECT_EQ(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).code(), absl::StatusCode::kInvalidArgument);
}

// The pipelined wrapper: each batch's result (or error) at its own fence, in order, with
// the bytes the CPU assembler writes directly.
TEST(PipelinedAssembler, EachFenceReportsItsOwnBatch) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0), Ref(&c, 1, 1)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(2, false), refs);
  ASSERT_TRUE(plan.ok());
  std::vector<std::byte> want(plan->total_bytes);
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(want)).ok());
  auto piped = MakePipelinedAssembler(MakeCpuAssembler());
  EXPECT_STREQ(piped->name(), "cpu");
  std::vector<std::vector<std::byte>> out(5, std::vector<std::byte>(plan->total_bytes, std::byte{0xAB}));
  std::vector<uint64_t> fences;
  for (size_t i = 0; i < out.size(); ++i) {
    // Batch 2's destination is one byte short: only its fence fails.
    auto dst = absl::MakeSpan(out[i]).subspan(0, i == 2 ? plan->total_bytes - 1 : plan->total_bytes);
    auto f = piped->Begin(*plan, refs, dst);
    ASSERT_TRUE(f.ok()) << f.status();
    fences.push_back(*f);
  }
  for (size_t i = 1; i < fences.size(); ++i) EXPECT_GT(fences[i], fences[i - 1]);
  for (size_t i = 0; i < out.size(); ++i) {
    absl::Status st = piped->Wait(fences[i]);
    if (i == 2) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      continue;
    }
    ASSERT_TRUE(st.ok()) << i << ": " << st;
    EXPECT_EQ(out[i], want) << "batch " << i;
  }
  EXPECT_EQ(piped->Wait(fences.back() + 1).code(), absl::StatusCode::kInvalidArgument);
  // The synchronous call still works, between and after pipelined ones.
  std::vector<std::byte> again(plan->total_bytes);
  ASSERT_TRUE(piped->Assemble(*plan, refs, absl::MakeSpan(again)).ok());
  EXPECT_EQ(again, want);
}

// Destroyed with batches begun and not waited for: it finishes them (their memory may be read
// by whoever began them) instead of leaving a thread writing into freed memory.
TEST(PipelinedAssembler, DestructionFinishesWhatWasBegun) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0), Ref(&c, 1, 1)};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(2, false), refs);
  ASSERT_TRUE(plan.ok());
  std::vector<std::vector<std::byte>> out(16, std::vector<std::byte>(plan->total_bytes, std::byte{0xAB}));
  {
    auto piped = MakePipelinedAssembler(MakeCpuAssembler());
    for (auto& o : out) ASSERT_TRUE(piped->Begin(*plan, refs, absl::MakeSpan(o)).ok());
  }
  for (auto& o : out) EXPECT_EQ(o, out[0]);
  EXPECT_NE(out[0], std::vector<std::byte>(plan->total_bytes, std::byte{0xAB}));
}

// Truncated BPTT: pieces of sequences at time offsets, with mask and begin/end flags.
TEST(BatchLayout, TruncatedPiecesFillStepsWithMaskAndFlags) {
  ParsedChunk c = MakeChunk();
  // Row 0: the last sample of sequence 0 (continuing), then sequence 1 (begins and ends).
  PieceRef a = Ref(&c, 0, 0);
  a.sample_begin = 1;
  a.sample_count = 1;
  a.begins = false;
  PieceRef b = Ref(&c, 1, 0);
  b.t0 = 1;
  BatchShape shape;
  shape.rows = 2;
  shape.steps = 3;
  std::vector<PieceRef> refs = {a, b};
  auto plan = PlanBatch(Streams(), Precision::kFloat, shape, refs);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::byte> buf(plan->total_bytes);
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(Read<uint8_t>(buf, plan->mask), (std::vector<uint8_t>{1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(Read<uint8_t>(buf, plan->flags), (std::vector<uint8_t>{2, 3, 0, 0, 0, 0}));
  const StreamLayout& d = plan->streams[0];
  EXPECT_EQ(Read<int32_t>(buf, d.lengths), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(Read<float>(buf, d.values), (std::vector<float>{3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0}));
  const StreamLayout& s = plan->streams[1];
  // Columns row*3+t: (0,0)=sample 1 of seq 0 (no entries), (0,1)=seq 1 (one entry), rest empty.
  EXPECT_EQ(Read<int32_t>(buf, s.colptr), (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(Read<int32_t>(buf, s.rowind), (std::vector<int32_t>{4}));
}

// The example chunk asked for as CSR and as dense, checked against hand-computed arrays.
// The sparse stream is the 10 x 4 matrix with columns (seq, step): (0,0) = {9: 0.5, 1: 1.5},
// (0,1) = {}, (1,0) = {4: 2.5}, (1,1) = padding.
TEST(BatchLayout, SparseStreamAsCsr) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0), Ref(&c, 1, 1)};
  const std::vector<OutputLayout> layouts = {OutputLayout::kNative, OutputLayout::kCsr};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(2, false), refs, layouts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StreamLayout& s = plan->streams[1];
  EXPECT_TRUE(s.csr());
  EXPECT_FALSE(s.colptr.present());
  EXPECT_EQ(s.rowptr.shape, (std::vector<uint64_t>{11}));
  std::vector<std::byte> buf(plan->total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).ok());
  // Rows 1, 4, 9 hold one entry each, in columns 0, 2, 0.
  EXPECT_EQ(Read<int32_t>(buf, s.rowptr), (std::vector<int32_t>{0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3}));
  EXPECT_EQ(Read<int32_t>(buf, s.colind), (std::vector<int32_t>{0, 2, 0}));
  EXPECT_EQ(Read<float>(buf, s.values), (std::vector<float>{1.5f, 2.5f, 0.5f}));
  EXPECT_EQ(Read<int32_t>(buf, s.lengths), (std::vector<int32_t>{2, 1}));
  for (size_t i = s.values.offset + s.values.bytes; i < buf.size(); ++i) ASSERT_EQ(buf[i], std::byte{0}) << i;
}

TEST(BatchLayout, SparseStreamAsDenseSumsRepeatedIndices) {
  ParsedChunk c = MakeChunk();
  c.streams[1].indices = {3, 3, 4};  // sample 0 names index 3 twice: 0.5 + 1.5
  std::vector<PieceRef> refs = {Ref(&c, 1, 0), Ref(&c, 0, 1)};
  const std::vector<OutputLayout> layouts = {OutputLayout::kDense, OutputLayout::kDense};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(2, false), refs, layouts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StreamLayout& s = plan->streams[1];
  EXPECT_TRUE(s.dense_values());
  EXPECT_EQ(s.values.shape, (std::vector<uint64_t>{2, 2, 10}));
  std::vector<std::byte> buf(plan->total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).ok());
  std::vector<float> want(40, 0.0f);
  want[0 * 10 + 4] = 2.5f;      // row 0 = sequence 9: one sample, index 4
  want[2 * 10 + 3] = 2.0f;      // row 1 step 0 = sequence 7's first sample
  EXPECT_EQ(Read<float>(buf, s.values), want);
  EXPECT_EQ(Read<int32_t>(buf, s.lengths), (std::vector<int32_t>{1, 2}));
}

// A batch with no rows (a rank that owns no chunk of a minibatch gets one): every mode and
// layout plans and assembles it, into a destination with no memory at all when it has no
// bytes; a CSC stream's colptr is the one 0 and every other byte is zero. (Under the
// sanitizers, the assembler's arithmetic on a null destination and on empty arrays was
// undefined behaviour and ended the daemon: found by python_torch in the fuzzers' tree.)
TEST(BatchLayout, AnEmptyBatchIsWellFormedInEveryModeAndLayout) {
  std::vector<StreamConfig> streams = Streams();
  streams.push_back({"i", "i", StreamFormat::kIds, 1, false});
  const std::vector<std::vector<OutputLayout>> layouts = {
      {}, {OutputLayout::kNative, OutputLayout::kCsr, OutputLayout::kNative},
      {OutputLayout::kDense, OutputLayout::kDense, OutputLayout::kNative}};
  for (int mode = 0; mode < 3; ++mode) {  // sequences, frames, truncated BPTT
    for (const auto& layout : layouts) {
      BatchShape shape = Shape(0, mode == 1);
      if (mode == 2) shape.steps = 4;
      auto plan = PlanBatch(streams, Precision::kFloat, shape, {}, layout);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->num_sequences, 0u);
      std::vector<std::byte> buf(plan->total_bytes, std::byte{0xAB});
      const absl::Span<std::byte> dst = buf.empty() ? absl::Span<std::byte>() : absl::MakeSpan(buf);
      ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, {}, dst).ok()) << "mode " << mode;
      for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], std::byte{0}) << "mode " << mode << ", byte " << i;
      const StreamLayout& sparse = plan->streams[1];
      if (sparse.csc()) {
        EXPECT_EQ(Read<int32_t>(buf, sparse.colptr), (std::vector<int32_t>{0}));
      }
      if (sparse.csr()) {
        EXPECT_EQ(Read<int32_t>(buf, sparse.rowptr), std::vector<int32_t>(11, 0));
      }
      // The same through the two-step form a loader uses (Begin, then Wait).
      auto cpu = MakeCpuAssembler();
      auto fence = cpu->Begin(*plan, {}, dst);
      ASSERT_TRUE(fence.ok()) << fence.status();
      ASSERT_TRUE(cpu->Wait(*fence).ok());
    }
  }
}

TEST(BatchLayout, LayoutsThatDoNotApplyAreRefused) {
  ParsedChunk c = MakeChunk();
  std::vector<PieceRef> refs = {Ref(&c, 0, 0)};
  const std::vector<OutputLayout> layouts = {OutputLayout::kCsr, OutputLayout::kNative};
  auto plan = PlanBatch(Streams(), Precision::kFloat, Shape(1, false), refs, layouts);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "stream 'd' is dense: layout csr applies to sparse streams only");
  // A dense stream asked for as dense is its native layout.
  const std::vector<OutputLayout> dense = {OutputLayout::kDense, OutputLayout::kCsc};
  EXPECT_TRUE(PlanBatch(Streams(), Precision::kFloat, Shape(1, false), refs, dense).ok());
}

TEST(BatchLayout, AHugeDenseLayoutIsRefusedNotAllocated) {
  ParsedChunk c = MakeChunk();
  c.streams[1].dim = 1u << 30;
  std::vector<StreamConfig> streams = Streams();
  streams[1].dim = 1u << 30;
  std::vector<PieceRef> refs = {Ref(&c, 0, 0), Ref(&c, 1, 9)};
  const std::vector<OutputLayout> layouts = {OutputLayout::kNative, OutputLayout::kDense};
  auto plan = PlanBatch(streams, Precision::kFloat, Shape(10, false), refs, layouts);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("ask for CSC or CSR"), std::string::npos) << plan.status();
}

}  // namespace
}  // namespace conveyor
