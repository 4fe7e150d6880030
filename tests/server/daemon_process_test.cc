// conveyord as a process: kill -9 mid-epoch, restart, resume from the last batch consumed:
// every sequence of the epoch arrives, none twice. SIGTERM drains and exits 0.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "client/cpp/conveyor_client.h"
#include "gtest/gtest.h"
#include "tests/server/daemon_process.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

v1::Subscribe Sub() {
  v1::Subscribe s;
  s.set_dataset("sparse");
  s.set_minibatch_size(100);
  s.set_randomize(true);
  s.set_seed(9);
  return s;
}

TEST(DaemonProcess, KillNineRestartResumeDeliversEverySequenceOnce) {
  TempDir dir;
  std::multiset<uint64_t> keys;
  std::string cursor;
  {
    DaemonProcess d(dir.path());
    ASSERT_TRUE(d.started());
    auto client = Client::Connect(d.address());
    SubscribeOptions once;
    once.reconnect = false;
    auto sub = (*client)->Subscribe(Sub(), once);
    ReceivedBatch b;
    for (int i = 0; i < 7; ++i) {
      ASSERT_TRUE(*(*sub)->Next(&b));
      for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
    }
    d.Kill(SIGKILL);  // mid-epoch, with batches in flight
    // Batches already received before the kill are still consumed; then the stream breaks.
    while (true) {
      auto after = (*sub)->Next(&b);
      if (!after.ok()) break;
      ASSERT_TRUE(*after);
      for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
    }
    cursor = (*sub)->last_cursor();
    EXPECT_LT(keys.size(), 2000u);
  }
  DaemonProcess restarted(dir.path());
  ASSERT_TRUE(restarted.started());
  auto client = Client::Connect(restarted.address());
  v1::Subscribe s = Sub();
  s.set_resume_cursor(cursor);
  auto sub = (*client)->Subscribe(s);
  ReceivedBatch b;
  while (true) {
    auto more = (*sub)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
  }
  EXPECT_EQ(keys.size(), 2000u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 2000u);
}

// Two replicas behind one client: the daemon serving the stream is killed mid-epoch, the
// subscription resumes from its cursor on the other, and the epoch arrives exactly once.
TEST(DaemonProcess, FailoverToAReplicaCompletesTheEpochExactlyOnce) {
  TempDir dir;
  auto a = std::make_unique<DaemonProcess>(dir.path());
  DaemonProcess b(dir.path());
  ASSERT_TRUE(a->started() && b.started());
  auto client = Client::Connect(a->address() + "," + b.address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto names = (*client)->ListDatasets();
  ASSERT_TRUE(names.ok()) << names.status();
  auto sub = (*client)->Subscribe(Sub());
  ASSERT_TRUE(sub.ok());
  std::multiset<uint64_t> keys;
  ReceivedBatch batch;
  uint64_t batches = 0;
  while (true) {
    auto more = (*sub)->Next(&batch);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    for (uint64_t k : batch.descriptor().pieces().key()) keys.insert(k);
    if (++batches == 5) {
      EXPECT_EQ((*sub)->address(), a->address());
      a.reset();  // kill -9 of the daemon in use, batches in flight
    }
  }
  EXPECT_EQ((*sub)->address(), b.address());
  EXPECT_EQ(keys.size(), 2000u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 2000u);
  // Unary calls skip the dead replica too.
  EXPECT_TRUE((*client)->Describe("sparse").ok());
}

// `conveyor health` (the container's HEALTHCHECK) against a live daemon, one that ignores
// SIGHUP, and a dead one.
TEST(DaemonProcess, HealthCommandTellsServingFromGone) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  auto health = [&] {
    const std::string cmd = std::string(CONVEYOR_BINARY) + " health --quiet --timeout 2 " + d.address();
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(health(), 0);
  d.Signal(SIGHUP);  // reload is not supported: the daemon says so and keeps serving
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(health(), 0);
  d.Kill(SIGKILL);
  EXPECT_EQ(health(), 1);
}

TEST(DaemonProcess, SigtermDrainsAndExitsCleanly) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  auto client = Client::Connect(d.address());
  SubscribeOptions once;
  once.reconnect = false;
  v1::Subscribe s = Sub();
  s.set_epochs(1000);
  auto sub = (*client)->Subscribe(s, once);
  ReceivedBatch b;
  ASSERT_TRUE(*(*sub)->Next(&b));
  std::thread stopper([&] { EXPECT_EQ(d.Kill(SIGTERM), 0); });
  absl::Status end;
  for (int i = 0; i < 100000; ++i) {
    auto more = (*sub)->Next(&b);
    if (!more.ok()) {
      end = more.status();
      break;
    }
  }
  stopper.join();
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
}

}  // namespace
}  // namespace conveyor::testing
