// Work bounded by what exists: requests that ask for astronomically many epochs, epochs of
// nearly 2^64 samples, or a rank that owns no chunk cost the loader nothing until batches are
// delivered, and a loader can be cancelled while it plans or waits for a chunk.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/batch/assembler.h"
#include "common/sampling/cursor.h"
#include "common/sampling/loader.h"
#include "common/sampling/parser_pool.h"
#include "common/sampling/stream_request.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

// Runs `work` on a thread of its own and says whether it returned within `limit`. A loop
// that never ends then fails the test instead of hanging it (the thread is left behind; it
// owns what it uses).
bool ReturnsWithin(std::chrono::milliseconds limit, std::function<void()> work) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread([done, work = std::move(work)] {
    work();
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(done->mu);
  return done->cv.wait_for(lock, limit, [&] { return done->done; });
}

// 400 one-sample sequences in 30 chunks (or one).
struct SmallDataset {
  explicit SmallDataset(uint64_t chunk_size = 150) {
    std::string data;
    for (int i = 0; i < 400; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
    DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}}");
    c.deserializers[0].chunk_size_in_bytes = chunk_size;
    auto ds = Dataset::Open(c);
    EXPECT_TRUE(ds.ok()) << ds.status();
    dataset = std::move(*ds);
  }
  TempDir dir;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<BatchAssembler> cpu = MakeCpuAssembler();
};

struct Outcome {
  std::mutex mu;
  std::vector<uint32_t> rows;
  std::vector<uint64_t> epochs;
  absl::Status status;
};

// Reads `batches` batches of a loader made with `options` on the small dataset.
std::shared_ptr<Outcome> ReadBatches(const LoaderOptions& options, int batches, bool* in_time,
                                     uint64_t chunk_size = 150) {
  auto data = std::make_shared<SmallDataset>(chunk_size);
  EXPECT_EQ(data->dataset->index().chunks.size(), chunk_size == 150 ? 30u : 1u);
  auto out = std::make_shared<Outcome>();
  *in_time = ReturnsWithin(std::chrono::seconds(10), [data, out, options, batches] {
    auto loader = Loader::Create(data->dataset.get(), data->cpu.get(), options);
    if (!loader.ok()) {
      std::lock_guard<std::mutex> lock(out->mu);
      out->status = loader.status();
      return;
    }
    for (int i = 0; i < batches; ++i) {
      Batch b;
      auto more = (*loader)->Next(&b);
      std::lock_guard<std::mutex> lock(out->mu);
      if (!more.ok()) out->status = more.status();
      if (!more.ok() || !*more) return;
      out->rows.push_back(b.plan.shape.rows);
      out->epochs.push_back(b.epoch);
    }
  });
  return out;
}

// world=65536 rank=65535 on 30 chunks: no chunk is ever this rank's, so every batch is
// empty; the prefetch must not walk the 2^32 epochs' sweeps looking for one.
TEST(BoundedWork, ARankOwningNoChunkGetsItsEmptyBatchesAtOnce) {
  LoaderOptions o;
  o.planner.minibatch_size = 64;
  o.planner.epochs = uint64_t{1} << 32;
  o.planner.world = 65536;
  o.planner.rank = 65535;
  o.planner.randomizer.randomize = true;
  o.planner.randomizer.window = 4;
  bool in_time = false;
  auto out = ReadBatches(o, 20, &in_time);
  ASSERT_TRUE(in_time) << "the loader spun instead of delivering";
  std::lock_guard<std::mutex> lock(out->mu);
  ASSERT_TRUE(out->status.ok()) << out->status;
  ASSERT_EQ(out->rows.size(), 20u);
  for (uint32_t r : out->rows) EXPECT_EQ(r, 0u);
  // 400 samples a sweep in minibatches of 64: 7 a sweep (the 7th of 16), then epoch 1.
  EXPECT_EQ(out->epochs[6], 0u);
  EXPECT_EQ(out->epochs[7], 1u);
}

// An epoch of 2^64 - 2 samples: the first batches come at once and the timeline runs on
// across sweeps (the epoch's end is never reached, and nothing overflows), whether the
// prefetch finds chunks to schedule (30) or has them all open already (1).
TEST(BoundedWork, AnEpochOfNearlyTwoToThe64SamplesCostsNothingUntilUsed) {
  for (uint64_t epochs : {uint64_t{1}, uint64_t{1} << 32})
  for (uint64_t chunk_size : {uint64_t{150}, uint64_t{1} << 20}) {
    LoaderOptions o;
    o.planner.minibatch_size = 10;
    o.planner.epochs = epochs;
    o.planner.epoch_size = UINT64_MAX - 1;
    o.threads = 2;  // 4 chunks prefetched: more than a one-chunk dataset has
    bool in_time = false;
    auto out = ReadBatches(o, 12, &in_time, chunk_size);
    ASSERT_TRUE(in_time) << "the loader spun instead of delivering (" << epochs << " epochs, chunks of "
                         << chunk_size << " bytes)";
    std::lock_guard<std::mutex> lock(out->mu);
    ASSERT_TRUE(out->status.ok()) << out->status;
    ASSERT_EQ(out->rows.size(), 12u);
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_EQ(out->rows[i], 10u) << i;
      EXPECT_EQ(out->epochs[i], 0u) << i;
    }
  }
}

// 2^32 epochs of one sweep: the planner and the prefetch walk only what is delivered (here a
// one-chunk dataset whose chunk is always open already).
TEST(BoundedWork, FourBillionEpochsStartAtOnce) {
  LoaderOptions o;
  o.planner.minibatch_size = 10;
  o.planner.epochs = uint64_t{1} << 32;
  o.threads = 2;
  bool in_time = false;
  auto out = ReadBatches(o, 100, &in_time, uint64_t{1} << 20);
  ASSERT_TRUE(in_time) << "the loader spun instead of delivering";
  std::lock_guard<std::mutex> lock(out->mu);
  ASSERT_TRUE(out->status.ok()) << out->status;
  ASSERT_EQ(out->epochs.size(), 100u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(out->epochs[i], i / 40) << i;
}

// Epochs of one sample over sequences of 1000 samples: 999 of every 1000 epochs are empty
// (no sequence starts in them) and are skipped arithmetically, not one by one.
TEST(BoundedWork, EmptyEpochsAreSkippedNotWalked) {
  Index index;
  for (uint64_t i = 0; i < 4; ++i) index.sequences.push_back({i, i * 10, i, 10, 1u << 30});
  index.BuildChunks(1000);
  PlannerOptions o;
  o.minibatch_size = 1;
  o.epochs = uint64_t{1} << 32;
  o.epoch_size = 1;
  auto planner = Planner::Create(&index, o);
  ASSERT_TRUE(planner.ok());
  std::vector<uint64_t> epochs;
  const bool in_time = ReturnsWithin(std::chrono::seconds(10), [&] {
    for (int i = 0; i < 3; ++i) epochs.push_back((*planner)->Next()->epoch);
  });
  ASSERT_TRUE(in_time) << "the planner walked the empty epochs one by one";
  EXPECT_EQ(epochs, (std::vector<uint64_t>{0, uint64_t{1} << 30, uint64_t{2} << 30}));
}

// A loader waiting for a chunk (every parser thread busy) returns CANCELLED once cancelled,
// from another thread; later calls do too.
TEST(BoundedWork, CancelInterruptsALoaderWaitingForAChunk) {
  SmallDataset data;
  ParserPool pool(1);
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    void Open() {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
      cv.notify_all();
    }
  } gate;
  pool.Submit([&] {  // occupies the only parser thread until the gate opens
    std::unique_lock<std::mutex> lock(gate.mu);
    gate.cv.wait(lock, [&] { return gate.open; });
  });
  LoaderOptions o;
  o.planner.minibatch_size = 10;
  o.pool = &pool;
  auto loader = Loader::Create(data.dataset.get(), data.cpu.get(), o);
  ASSERT_TRUE(loader.ok());
  struct OpenOnExit {  // before the loader is destroyed, which waits for its parse job
    Gate* gate;
    ~OpenOnExit() { gate->Open(); }
  } open_on_exit{&gate};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*loader)->Cancel();
  });
  Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  auto more = (*loader)->Next(&b);
  const auto waited = std::chrono::steady_clock::now() - t0;
  canceller.join();
  EXPECT_EQ(more.status().code(), absl::StatusCode::kCancelled) << more.status();
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ((*loader)->Next(&b).status().code(), absl::StatusCode::kCancelled);
}

// Truncated BPTT's T x N steps are a minibatch's samples: bounded like minibatch_size.
TEST(BoundedWork, TruncationTimesParallelIsBounded) {
  SmallDataset data;
  StreamRequest r;
  r.truncation = 1u << 20;
  r.parallel = 1u << 16;
  auto resolved = ResolveStream(*data.dataset, r);
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(resolved.status().message(),
            "truncation x parallel (1048576 x 65536 steps) must be at most 16777216, the largest minibatch");
  r.parallel = 16;  // 2^24 steps: the limit itself
  EXPECT_TRUE(ResolveStream(*data.dataset, r).ok());
}

// Epochs that would start past the 2^64-sample timeline hold no data: a stream that asks to
// start in one is refused, and one that reaches them ends there instead of walking 2^32 of
// them (which kept a producer thread busy for minutes after its client had gone).
TEST(BoundedWork, EpochsPastTheTimelineAreRefusedOrEndTheStream) {
  SmallDataset data;
  StreamRequest r;
  r.epochs = uint64_t{1} << 32;
  r.epoch_size = UINT64_MAX;
  r.first_epoch = 3;
  auto resolved = ResolveStream(*data.dataset, r);
  ASSERT_TRUE(resolved.ok()) << resolved.status();  // (the planner checks where epochs start)
  auto cpu = MakeCpuAssembler();
  auto loader = Loader::Create(data.dataset.get(), cpu.get(), resolved->loader);
  EXPECT_EQ(loader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loader.status().message().find("would start past 2^64 samples"), std::string::npos) << loader.status();
  // Epochs of (2^64 - 1) / 3 samples: epoch 3 starts at the timeline's last sample, epoch 4
  // would start past it. Started in epoch 3, the stream ends at once, not 2^32 epochs later.
  Index index;
  for (uint64_t i = 0; i < 4; ++i) index.sequences.push_back({i, i * 10, i, 10, 1});
  index.BuildChunks(1000);
  PlannerOptions o;
  o.minibatch_size = 1;
  o.epochs = uint64_t{1} << 32;
  o.epoch_size = UINT64_MAX / 3;
  auto planner = Planner::Create(&index, o);
  ASSERT_TRUE(planner.ok());
  EXPECT_FALSE((*planner)->SeekEpoch(4).ok());
  ASSERT_TRUE((*planner)->SeekEpoch(3).ok());
  uint64_t batches = 0;
  const bool in_time = ReturnsWithin(std::chrono::seconds(10), [&] {
    while ((*planner)->Next() && batches < 1000) ++batches;
  });
  ASSERT_TRUE(in_time) << "the planner walked the epochs past the timeline one by one";
  EXPECT_LE(batches, 1u);
}

// The world a cursor carries is bounded like a request's (a cursor is checked, not signed).
TEST(BoundedWork, ACursorsWorldIsBounded) {
  SmallDataset data;
  StreamRequest r;
  Cursor c;
  c.data_hash = IndexHash(data.dataset->index());
  c.world = 1u << 20;
  r.resume = EncodeCursor(c);
  auto resolved = ResolveStream(*data.dataset, r);
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(resolved.status().message(), "cursor says world 1048576: it must be between 1 and 65536");
}

}  // namespace
}  // namespace conveyor::testing
