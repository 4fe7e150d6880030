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
  std::vector<SequenceRef> refs = {{&c, 0}, {&c, 1}};
  auto plan = PlanBatch(Streams(), Precision::kFloat, /*frame_mode=*/false, refs);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_sequences, 2u);
  EXPECT_EQ(plan->num_samples, 3u);
  EXPECT_EQ(plan->keys, (std::vector<uint64_t>{7, 9}));
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
  std::vector<SequenceRef> refs = {{&c, 1}};
  auto plan = PlanBatch(Streams(), Precision::kFloat, /*frame_mode=*/true, refs);
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
  std::vector<SequenceRef> refs = {{&c, 0}};
  auto plan = PlanBatch(Streams(), Precision::kFloat, /*frame_mode=*/true, refs);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("frame mode: sequence 7 has 2 samples"), std::string::npos);
}

TEST(BatchLayout, AssemblerRefusesASmallSlot) {
  ParsedChunk c = MakeChunk();
  std::vector<SequenceRef> refs = {{&c, 0}};
  auto plan = PlanBatch(Streams(), Precision::kFloat, false, refs);
  std::vector<std::byte> buf(plan->total_bytes - 1);
  EXPECT_EQ(MakeCpuAssembler()->Assemble(*plan, refs, absl::MakeSpan(buf)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
