// HealthService: Check and Watch as the standard health protocol has them, and the bound on
// Watch calls open at once (health calls need no token).
#include "server/health_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/test_daemon.h"

namespace conveyor::testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = Health::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5)); }

  grpc::Status Check(const std::string& service, HealthCheckResponse* out) {
    grpc::ClientContext ctx;
    HealthCheckRequest req;
    req.set_service(service);
    return stub_->Check(&ctx, req, out);
  }

  struct Watch {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
  };
  std::unique_ptr<Watch> StartWatch(const std::string& service = "") {
    auto w = std::make_unique<Watch>();
    w->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    HealthCheckRequest req;
    req.set_service(service);
    w->reader = stub_->Watch(&w->ctx, req);
    return w;
  }

  HealthService health_{3};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckAnswersForTheServerAndTheLoaderAndNotOtherNames) {
  HealthCheckResponse r;
  ASSERT_TRUE(Check("", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check("conveyor.v1.Loader", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check("other.Service", &r).error_code(), grpc::StatusCode::NOT_FOUND);
  health_.SetServing(false);
  ASSERT_TRUE(Check("", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchSendsTheStatusAndEachChangeForABoundedNumberOfCalls) {
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 3; ++i) {
    watches.push_back(StartWatch());
    HealthCheckResponse r;
    ASSERT_TRUE(watches.back()->reader->Read(&r));
    EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(health_.watches(), 3u);
  // A fourth is refused at once: the calls open are what a peer without a token could pile up.
  auto fourth = StartWatch();
  HealthCheckResponse r;
  EXPECT_FALSE(fourth->reader->Read(&r));
  const grpc::Status refused = fourth->reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("more than 3 health watches"), std::string::npos) << refused.error_message();
  // A drain: every watcher hears NOT_SERVING.
  health_.SetServing(false);
  for (auto& w : watches) {
    ASSERT_TRUE(w->reader->Read(&r));
    EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  }
  // Calls that end give their place back.
  for (auto& w : watches) w->ctx.TryCancel();
  for (auto& w : watches) (void)w->reader->Finish();
  EXPECT_TRUE(WaitFor(10, [&] { return health_.watches() == 0; }));
  auto again = StartWatch("other.Service");
  ASSERT_TRUE(again->reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  again->ctx.TryCancel();
  (void)again->reader->Finish();
}

}  // namespace
}  // namespace conveyor::testing
