// Batch descriptors both ways (proto/wire.h): the compact form of one-sample rows
// (Pieces.single_sample_rows) describes the same plan as the full one, is used only where
// it is exact, and a descriptor that misuses it is refused.
#include "proto/wire.h"

#include <gtest/gtest.h>

namespace conveyor {
namespace {

// A frame-mode batch of `rows` one-sample pieces in `streams` dense streams of dim 1.
BatchPlan FramePlan(uint32_t rows, size_t streams = 2) {
  BatchPlan plan;
  plan.shape.rows = rows;
  plan.shape.frame_mode = true;
  plan.num_samples = rows;
  plan.total_bytes = uint64_t{rows} * 4;
  for (size_t s = 0; s < streams; ++s) {
    StreamLayout L;
    L.name = "s" + std::to_string(s);
    L.dim = 1;
    L.values.dtype = DType::kFloat32;
    L.values.bytes = plan.total_bytes;  // the streams may overlap: only sizes are checked here
    L.values.shape = {rows, 1};
    plan.streams.push_back(L);
  }
  plan.num_streams = streams;
  plan.num_sequences = rows;
  for (uint32_t i = 0; i < rows; ++i) {
    PlacedPiece p;
    p.key = 1000 + 7 * i;
    p.row = i;
    p.longest = 1;
    plan.pieces.push_back(p);
  }
  plan.counts.assign(uint64_t{rows} * streams, 1);
  return plan;
}

void ExpectSamePieces(const BatchPlan& a, const BatchPlan& b) {
  ASSERT_EQ(a.pieces.size(), b.pieces.size());
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    EXPECT_EQ(a.pieces[i].key, b.pieces[i].key) << i;
    EXPECT_EQ(a.pieces[i].row, b.pieces[i].row) << i;
    EXPECT_EQ(a.pieces[i].t0, b.pieces[i].t0) << i;
    EXPECT_EQ(a.pieces[i].sample_begin, b.pieces[i].sample_begin) << i;
    EXPECT_EQ(a.pieces[i].frame, b.pieces[i].frame) << i;
    EXPECT_EQ(a.pieces[i].longest, b.pieces[i].longest) << i;
    EXPECT_EQ(a.pieces[i].name, b.pieces[i].name) << i;
  }
  EXPECT_EQ(a.counts, b.counts);
}

TEST(Wire, CompactDescriptorsOfOneSampleRowsListOnlyTheKeys) {
  const BatchPlan plan = FramePlan(300);
  v1::BatchDescriptor full, compact;
  PlanToDescriptor(plan, &full);
  PlanToDescriptor(plan, &compact, /*compact=*/true);
  EXPECT_FALSE(full.pieces().single_sample_rows());
  EXPECT_EQ(full.pieces().row_size(), 300);
  EXPECT_EQ(full.pieces().counts_size(), 600);
  EXPECT_TRUE(compact.pieces().single_sample_rows());
  EXPECT_EQ(compact.pieces().key_size(), 300);
  EXPECT_EQ(compact.pieces().row_size() + compact.pieces().t0_size() + compact.pieces().sample_begin_size() +
                compact.pieces().counts_size(),
            0);
  EXPECT_LT(compact.ByteSizeLong() * 2, full.ByteSizeLong());
  auto from_full = DescriptorToPlan(full);
  auto from_compact = DescriptorToPlan(compact);
  ASSERT_TRUE(from_full.ok()) << from_full.status();
  ASSERT_TRUE(from_compact.ok()) << from_compact.status();
  ExpectSamePieces(*from_full, plan);
  ExpectSamePieces(*from_compact, plan);
}

// String keys (Kaldi, HTK) travel one a piece, in both forms, whatever the first one is:
// an empty name first (a piece whose chunk has none) made the sender drop them all.
TEST(Wire, NamesTravelOneAPieceInBothForms) {
  BatchPlan plan = FramePlan(4);
  const std::vector<std::string> names = {"", "utt_1", std::string("m\xfcller"),
                                          "an_utterance_name_well_past_fifteen_characters"};
  for (size_t i = 0; i < names.size(); ++i) plan.pieces[i].name = names[i];
  for (bool compact : {false, true}) {
    v1::BatchDescriptor d;
    PlanToDescriptor(plan, &d, compact);
    EXPECT_EQ(d.pieces().single_sample_rows(), compact);  // both forms, indeed
    ASSERT_EQ(d.pieces().name_size(), 4) << compact;
    auto back = DescriptorToPlan(d);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSamePieces(*back, plan);
  }
  for (PlacedPiece& p : plan.pieces) p.name.clear();  // integer keys: no list at all
  v1::BatchDescriptor d;
  PlanToDescriptor(plan, &d, true);
  EXPECT_EQ(d.pieces().name_size(), 0);
}

TEST(Wire, PiecesThatAreNotOneSampleRowsAreDescribedInFull) {
  for (int change = 0; change < 4; ++change) {
    BatchPlan plan = FramePlan(8);
    switch (change) {
      case 0:
        std::swap(plan.pieces[2].row, plan.pieces[3].row);
        break;
      case 1:
        plan.pieces[5].t0 = 1;
        break;
      case 2:
        plan.pieces[7].sample_begin = 4;
        break;
      case 3:
        plan.counts[9] = 0;  // piece 4 has no sample of stream 1
        break;
    }
    v1::BatchDescriptor d;
    PlanToDescriptor(plan, &d, /*compact=*/true);
    EXPECT_FALSE(d.pieces().single_sample_rows()) << change;
    EXPECT_EQ(d.pieces().row_size(), 8) << change;
    EXPECT_EQ(d.pieces().counts_size(), 16) << change;
  }
}

TEST(Wire, ACompactDescriptorWithTheListsItImpliesIsRefused) {
  v1::BatchDescriptor d;
  PlanToDescriptor(FramePlan(4), &d, /*compact=*/true);
  ASSERT_TRUE(DescriptorToPlan(d).ok());
  for (int list = 0; list < 4; ++list) {
    v1::BatchDescriptor bad = d;
    v1::Pieces* q = bad.mutable_pieces();
    for (int i = 0; i < 4; ++i) {
      if (list == 0) q->add_row(i);
      if (list == 1) q->add_t0(0);
      if (list == 2) q->add_sample_begin(0);
      if (list == 3) q->add_counts(1), q->add_counts(1);
    }
    auto plan = DescriptorToPlan(bad);
    ASSERT_FALSE(plan.ok()) << list;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(plan.status().message(), "single-sample rows with the piece lists they imply, or lists of another length");
  }
  // More pieces than rows: piece 4 would lie outside the batch (2 steps make room for 8).
  v1::BatchDescriptor more = d;
  more.mutable_pieces()->add_key(9);
  more.set_steps(2);
  for (v1::ArrayRef* a : {more.mutable_mask(), more.mutable_flags()}) {
    a->set_dtype(v1::DTYPE_UINT8);
    a->set_bytes(8);
    a->add_shape(4);
    a->add_shape(2);
  }
  auto outside = DescriptorToPlan(more);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(), "a piece lies outside the batch's rows");
  // A stream with no step for the pieces' one sample.
  v1::BatchDescriptor empty_rows = d;
  v1::StreamBatch* s = empty_rows.mutable_streams(1);
  s->set_sequence_axis(true);
  s->set_max_length(0);
  s->mutable_values()->set_bytes(0);
  s->mutable_values()->clear_shape();
  for (uint64_t x : {4, 0, 1}) s->mutable_values()->add_shape(x);
  s->mutable_lengths()->set_dtype(v1::DTYPE_INT32);
  s->mutable_lengths()->set_bytes(16);
  s->mutable_lengths()->add_shape(4);
  auto past = DescriptorToPlan(empty_rows);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().message(), "a piece runs past its row");
}

TEST(Wire, ACompactDescriptorImplyingTooManyCountsIsRefused) {
  // 16385 pieces x 4096 streams > 2^26 implied counts: refused before they are allocated.
  const uint32_t rows = (kMaxImpliedCounts / kMaxStreams) + 1;
  v1::BatchDescriptor d;
  PlanToDescriptor(FramePlan(rows, kMaxStreams), &d, /*compact=*/false);
  v1::Pieces* q = d.mutable_pieces();
  q->clear_row();
  q->clear_t0();
  q->clear_sample_begin();
  q->clear_counts();
  q->set_single_sample_rows(true);
  auto plan = DescriptorToPlan(d);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "single-sample rows implying 16385 pieces x 4096 streams (at most 67108864)");
  // The daemon describes such a batch in full.
  v1::BatchDescriptor full;
  PlanToDescriptor(FramePlan(rows, kMaxStreams), &full, /*compact=*/true);
  EXPECT_FALSE(full.pieces().single_sample_rows());
}

}  // namespace
}  // namespace conveyor
