// The protocol mappings the daemon and the C++ client share (proto/subscribe.h,
// proto/status.h): a request survives the trip through a Subscribe, a hostile Subscribe is
// refused naming its field, and statuses keep their code and message both ways.
#include "proto/subscribe.h"

#include "gtest/gtest.h"
#include "proto/status.h"

namespace conveyor {
namespace {

TEST(Subscribe, ARequestSurvivesTheTripThroughASubscribe) {
  StreamRequest r;
  r.randomize = true;
  r.seed = 7;
  r.minibatch_size = 64;
  r.epochs = 3;
  r.epoch_size = 1000;
  r.rank = 1;
  r.world = 4;
  r.frame_mode = false;
  r.full_minibatches = true;
  r.truncation = 20;
  r.parallel = 2;
  r.resume = "cursor";
  r.layouts["features"] = OutputLayout::kCsr;
  r.value_dtypes["features"] = DType::kBFloat16;
  r.distribution = Distribution::kChunks;
  r.first_epoch = 2;
  r.batch_stride = 3;
  r.batch_offset = 1;
  const v1::Subscribe s = MakeSubscribe("speech", r);
  EXPECT_EQ(s.dataset(), "speech");
  auto back = SubscribeToRequest(s);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->randomize, r.randomize);
  EXPECT_EQ(back->seed, r.seed);
  EXPECT_EQ(back->minibatch_size, r.minibatch_size);
  EXPECT_EQ(back->epochs, r.epochs);
  EXPECT_EQ(back->epoch_size, r.epoch_size);
  EXPECT_EQ(back->rank, r.rank);
  EXPECT_EQ(back->world, r.world);
  EXPECT_EQ(back->frame_mode, r.frame_mode);
  EXPECT_EQ(back->full_minibatches, r.full_minibatches);
  EXPECT_EQ(back->truncation, r.truncation);
  EXPECT_EQ(back->parallel, r.parallel);
  EXPECT_EQ(back->resume, r.resume);
  EXPECT_EQ(back->layouts, r.layouts);
  EXPECT_EQ(back->value_dtypes, r.value_dtypes);
  EXPECT_EQ(back->distribution, r.distribution);
  EXPECT_EQ(back->first_epoch, r.first_epoch);
  EXPECT_EQ(back->batch_stride, r.batch_stride);
  EXPECT_EQ(back->batch_offset, r.batch_offset);
}

TEST(Subscribe, DefaultsStayDefaults) {
  auto back = SubscribeToRequest(MakeSubscribe("d", StreamRequest{}));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->randomize.has_value());
  EXPECT_FALSE(back->full_minibatches.has_value());
  EXPECT_FALSE(back->distribution.has_value());
  EXPECT_EQ(back->batch_stride, 1u);
}

TEST(Subscribe, RefusesParallelWithoutTruncation) {
  v1::Subscribe s;
  s.set_parallel(2);
  auto r = SubscribeToRequest(s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "parallel needs truncation");
}

TEST(Subscribe, RefusesAnUnknownMinibatchMode) {
  v1::Subscribe s;
  s.set_minibatch_mode(static_cast<v1::MinibatchMode>(9));
  auto r = SubscribeToRequest(s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "unknown minibatch_mode 9 (expected MINIBATCH_MODE_DEFAULT, MINIBATCH_MODE_PARTIAL or "
            "MINIBATCH_MODE_FULL)");
}

TEST(Subscribe, RefusesADtypeOtherThanHalfPrecision) {
  v1::Subscribe s;
  (*s.mutable_dtypes())["x"] = v1::DTYPE_FLOAT32;
  auto r = SubscribeToRequest(s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "dtypes['x']: a stream's values may be asked as DTYPE_FLOAT16 or DTYPE_BFLOAT16 only");
}

TEST(Status, KeepsCodeAndMessageBothWays) {
  const absl::Status s = absl::ResourceExhaustedError("a segment of 4096 bytes does not fit");
  const grpc::Status g = ToGrpc(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(g.error_message(), "a segment of 4096 bytes does not fit");
  EXPECT_EQ(FromGrpc(g), s);
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace conveyor
