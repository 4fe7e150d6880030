// No request can wedge or bloat the daemon (issue 20): a stream that is cancelled while its
// producer waits never blocks a gRPC thread; enums out of range are refused; memory budgets
// (per subscription, per daemon, the chunk cache) refuse before allocating, naming the
// budget; memory goes back to the system when a stream ends, and inline batches split into
// parts are held once.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/sampling/parser_pool.h"
#include "gtest/gtest.h"
#include "tests/server/daemon_process.h"
#include "tests/server/test_daemon.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

// A parser pool's only thread, held until Open(). The held job shares the gate's state: once
// opened, the gate may go before the job has woken and left the wait (AddressSanitizer found
// the job reading a destroyed gate when the state was the gate's own members).
class PoolGate {
 public:
  explicit PoolGate(ParserPool* pool) : state_(std::make_shared<State>()) {
    pool->Submit([s = state_] {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->open; });
    });
  }
  ~PoolGate() { Open(); }
  void Open() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->open = true;
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

// A stream whose producer waits for a chunk (the parser pool is busy) is cancelled: the call
// ends and the subscription is released at once, without waiting for the parse; unary calls
// and later streams are served meanwhile; the daemon stops promptly.
TEST(Reliability, CancellingAStreamThatWaitsNeverBlocksTheServer) {
  ParserPool pool(1);
  ServiceOptions o;
  o.parser_pool = &pool;
  auto gate = std::make_unique<PoolGate>(&pool);
  auto d = std::make_unique<Daemon>(o);
  {
    auto stub = v1::Loader::NewStub(grpc::CreateChannel(d->tcp(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    ASSERT_TRUE(stream->Write(SubscribeRequest(Sub("sparse", 10))));
    ASSERT_TRUE(WaitFor(5, [&] { return d->service().active_streams() == 1; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the producer waits for its chunk
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(WaitFor(2, [&] { return d->service().active_streams() == 0; }))
      << "the cancelled stream is still held (its producer waits for the parse)";
  auto client = Client::Connect(d->tcp());
  auto names = (*client)->ListDatasets();
  EXPECT_TRUE(names.ok()) << names.status();
  gate->Open();
  auto sub = (*client)->Subscribe(Sub("sparse", 100));
  auto got = Drain(sub->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, LocalDump("sparse", 100));
  sub->reset();
  const auto t0 = std::chrono::steady_clock::now();
  d.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));
}

// The same while the daemon drains: a stream waiting for a chunk does not hold the drain.
TEST(Reliability, ADrainDoesNotWaitForAStreamThatWaits) {
  ParserPool pool(1);
  ServiceOptions o;
  o.parser_pool = &pool;
  PoolGate gate(&pool);
  auto d = std::make_unique<Daemon>(o);
  auto stub = v1::Loader::NewStub(grpc::CreateChannel(d->tcp(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  ASSERT_TRUE(stream->Write(SubscribeRequest(Sub("sparse", 10))));
  ASSERT_TRUE(WaitFor(5, [&] { return d->service().active_streams() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  d->service().Drain();
  const grpc::Status end = stream->Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::UNAVAILABLE) << end.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  d.reset();
}

TEST(Reliability, EnumsOutOfRangeAreInvalidArgument) {
  Daemon d;
  v1::Subscribe mode = Sub("sparse", 10);
  mode.set_minibatch_mode(static_cast<v1::MinibatchMode>(99));
  grpc::Status st = RawStream(d.tcp(), {SubscribeRequest(mode)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "unknown minibatch_mode 99 (expected MINIBATCH_MODE_DEFAULT, MINIBATCH_MODE_PARTIAL or MINIBATCH_MODE_FULL)");
  v1::Subscribe transport = Sub("sparse", 10);
  transport.set_transport(static_cast<v1::Transport>(-3));
  st = RawStream(d.tcp(), {SubscribeRequest(transport)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "unknown transport -3");
  v1::Subscribe bptt = Sub("sequences", 10);
  bptt.set_truncation(1u << 20);
  bptt.set_parallel(1u << 16);
  st = RawStream(d.tcp(), {SubscribeRequest(bptt)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("truncation x parallel"), std::string::npos) << st.error_message();
}

// The sparse dataset's 5000-word stream asked for as dense, one frame a row: 20,000 bytes a
// row, 2,000,768 bytes a batch of 100 (with the label, each array 256-aligned).
v1::Subscribe DenseWords(uint64_t mb, uint32_t credits) {
  v1::Subscribe s = Sub("sparse", mb);
  s.set_frame_mode(true);
  (*s.mutable_layouts())["words"] = v1::LAYOUT_DENSE;
  s.set_initial_credits(credits);
  return s;
}

TEST(Reliability, CreditsTimesABatchBeyondTheSubscriptionBudgetAreResourceExhausted) {
  ServiceOptions o;
  o.subscription_bytes = 8 << 20;
  Daemon d(o);
  auto client = Client::Connect(d.unix_socket());
  // 4 x 2,000,768 bytes fit 8 MiB: the whole epoch arrives, as dump prints it.
  auto fits = (*client)->Subscribe(DenseWords(100, 4));
  auto got = Drain(fits->get());
  ASSERT_TRUE(got.ok()) << got.status();
  StreamRequest dense;
  dense.frame_mode = true;
  dense.layouts["words"] = OutputLayout::kDense;
  EXPECT_EQ(*got, LocalDump("sparse", 100, dense));
  // 5 credits do not, inline or in shared memory; nor does one batch of 1000 rows.
  for (auto transport : {v1::TRANSPORT_INLINE, v1::TRANSPORT_SHARED_MEMORY}) {
    v1::Subscribe s = DenseWords(100, 5);
    s.set_transport(transport);
    auto sub = (*client)->Subscribe(s);
    ReceivedBatch b;
    auto first = (*sub)->Next(&b);
    EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted) << first.status();
    EXPECT_EQ(std::string(first.status().message()),
              "batch 0 of 2000640 bytes x 5 credits exceeds the subscription budget server.subscriptionBytes "
              "(8388608 bytes): ask for fewer credits or smaller batches (a sparse stream as CSC or CSR rather "
              "than dense)");
  }
  auto big = (*client)->Subscribe(DenseWords(1000, 1));
  ReceivedBatch b;
  auto first = (*big)->Next(&b);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted) << first.status();
  EXPECT_NE(std::string(first.status().message()).find("batch 0 of 20004096 bytes x 1 credits exceeds the subscription budget "
                                          "server.subscriptionBytes"),
            std::string::npos)
      << first.status();
}

// Shared-memory segments count against the daemon's budget while they exist: a second
// subscription that would pass it is refused, naming it, and admitted once the first ends.
TEST(Reliability, TheDaemonsInFlightBudgetIsSharedAndNamed) {
  ServiceOptions o;
  o.in_flight_bytes = 6 << 20;
  o.slot_headroom = 1.0;
  o.min_slot_bytes = 256;
  Daemon d(o);
  auto client = Client::Connect(d.unix_socket());
  auto shm = [](uint32_t credits) {
    v1::Subscribe s = DenseWords(100, credits);
    s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
    return s;
  };
  auto first = (*client)->Subscribe(shm(2));  // one segment of 2 slots of 2,000,768 bytes
  ReceivedBatch a;
  ASSERT_TRUE(*(*first)->Next(&a));
  auto second = (*client)->Subscribe(shm(2));
  ReceivedBatch b;
  auto refused = (*second)->Next(&b);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(std::string(refused.status().message()),
            "the daemon's budget for batches in flight, server.inFlightBytes (6291456 bytes), has 2290176 bytes "
            "left; a segment of 4001280 bytes does not fit");
  first->reset();
  ASSERT_TRUE(WaitFor(5, [&] { return d.service().active_streams() == 0; }));
  auto third = (*client)->Subscribe(shm(2));
  auto got = Drain(third->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Keys(*got).size(), 2000u);
}

TEST(Reliability, ParsingBeyondTheChunkCacheBudgetIsResourceExhausted) {
  ServiceOptions o;
  o.chunk_cache_bytes = 1024;
  Daemon d(o);
  auto client = Client::Connect(d.tcp());
  auto sub = (*client)->Subscribe(Sub("sparse", 100));
  ReceivedBatch b;
  auto first = (*sub)->Next(&b);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted) << first.status();
  EXPECT_NE(first.status().message().find("server.chunkCacheBytes (1024 bytes)"), std::string::npos)
      << first.status();
}

// A minibatch of many pieces costs bookkeeping besides its bytes (256 bytes a piece and 40
// more a stream: 336 for `simple`'s two): bounded by the subscription budget before anything
// is planned.
TEST(Reliability, PiecesOfAMinibatchAreBoundedByTheSubscriptionBudget) {
  ServiceOptions o;
  o.subscription_bytes = 64 << 10;
  Daemon d(o);
  v1::Subscribe s = Sub("simple", 1000);
  s.set_frame_mode(true);
  grpc::Status st = RawStream(d.tcp(), {SubscribeRequest(s)});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "minibatches of up to 1000 pieces need 336000 bytes of bookkeeping each, beyond the subscription "
            "budget server.subscriptionBytes (65536 bytes): ask for smaller minibatches");
  v1::Subscribe fits = Sub("simple", 190);  // 190 pieces: 63840 bytes
  fits.set_initial_credits(8);              // RawStream does not ack: all 6 batches at once
  EXPECT_TRUE(RawStream(d.tcp(), {SubscribeRequest(fits)}).ok());
}

// conveyord as a process: a subscriber asks for 8 batches of 40 MB (the sparse stream as
// dense) and reads none. The daemon holds about 8 x 40 MB (each batch once, though it
// travels in 1 MiB parts), and once the stream is cancelled its memory goes back to the
// system.
TEST(Reliability, MemoryReturnsToTheSystemWhenAStreamEnds) {
  if (kUnderAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine, so the daemon's RSS cannot show what it holds";
  }
  TempDir dir;
  DaemonProcess daemon(dir.path());
  ASSERT_TRUE(daemon.started());
  auto client = Client::Connect(daemon.address());
  {  // warm up: a stream of small batches
    auto warm = (*client)->Subscribe(Sub("sparse", 100));
    ASSERT_TRUE(Drain(warm->get()).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t baseline = daemon.RssBytes();
  const uint64_t batch = 2000 * 20000 + 2000 * 4 + 256;  // 2000 rows: the whole sweep
  auto stub = v1::Loader::NewStub(grpc::CreateChannel(daemon.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  v1::Subscribe heavy = DenseWords(2000, 8);
  heavy.set_epochs(100);
  ASSERT_TRUE(stream->Write(SubscribeRequest(heavy)));
  uint64_t peak = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // Growing until all 8 batches are made, then flat: the peak over a quiet second.
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    const uint64_t rss = daemon.RssBytes();
    if (rss > peak) peak = rss;
    if (peak > baseline + 6 * batch && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(3)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint64_t held = peak - baseline;
  std::printf("RSS baseline %llu MB, with 8 batches of %llu MB unread %llu MB (+%llu MB)\n",
              static_cast<unsigned long long>(baseline >> 20), static_cast<unsigned long long>(batch >> 20),
              static_cast<unsigned long long>(peak >> 20), static_cast<unsigned long long>(held >> 20));
  EXPECT_GT(held, 6 * batch) << "the daemon made fewer batches than credits allow";
  EXPECT_LT(held, 8 * batch + 8 * batch / 4) << "inline batches are held more than once";
  ctx.TryCancel();
  stream->Finish();
  uint64_t after = 0;
  EXPECT_TRUE(WaitFor(5, [&] {
    after = daemon.RssBytes();
    return after < baseline + (32 << 20);
  })) << "RSS stayed at " << (after >> 20) << " MB after the stream ended (baseline " << (baseline >> 20) << " MB)";
  std::printf("RSS after the stream ended: %llu MB\n", static_cast<unsigned long long>(after >> 20));
}

}  // namespace
}  // namespace conveyor::testing
