// The idle watchdog cancels a call whose deadline passes, and arming and disarming it around
// every read and write does not wake its thread each time.
#include "client/cpp/idle_watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace conveyor {
namespace {

using std::chrono::milliseconds;

TEST(IdleWatchdog, ArmingAndDisarmingDoNotWakeItsThread) {
  IdleWatchdog w;
  grpc::ClientContext ctx;
  for (int i = 0; i < 200; ++i) {
    w.Arm(&ctx, milliseconds(600000));
    EXPECT_FALSE(w.Disarm());
    std::this_thread::sleep_for(milliseconds(1));  // time for a thread that was woken to run
  }
  // The thread started with the first Arm and may have woken once for it (it started
  // before or after that deadline was set): no deadline passed, nothing else woke it.
  EXPECT_LE(w.wakeups(), 2u);
  EXPECT_FALSE(w.fired());
}

TEST(IdleWatchdog, AnEarlierDeadlineWakesItsThread) {
  IdleWatchdog w;
  grpc::ClientContext first, second;
  w.Arm(&first, milliseconds(600000));
  EXPECT_FALSE(w.Disarm());
  // The thread sleeps until the first deadline, ten minutes away: the second one, a moment
  // away, must wake it, or the call would wait ten minutes to be cancelled.
  w.Arm(&second, milliseconds(1));
  for (int i = 0; i < 1000 && !w.fired(); ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(w.fired());
  EXPECT_TRUE(w.Disarm());
}

TEST(IdleWatchdog, ADisarmedCallIsNotCancelledAndAnotherArmedLaterIs) {
  IdleWatchdog w;
  grpc::ClientContext ctx;
  w.Arm(&ctx, milliseconds(1));
  for (int i = 0; i < 1000 && !w.fired(); ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(w.Disarm());
  w.Arm(&ctx, milliseconds(600000));
  EXPECT_FALSE(w.fired());  // re-arming clears what the last deadline did
  EXPECT_FALSE(w.Disarm());
  w.Arm(&ctx, milliseconds(1));
  for (int i = 0; i < 1000 && !w.fired(); ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(w.Disarm());
}

}  // namespace
}  // namespace conveyor
