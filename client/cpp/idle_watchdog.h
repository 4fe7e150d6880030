// idle_watchdog.h: cancels a gRPC call that has been waiting for a message longer than its
// idle deadline (a daemon that is wedged, or whose host vanished without the connection
// noticing), so that the client fails over instead of waiting for TCP to give up.
//
// A subscription arms it around every read and write (three times a batch), so arming and
// disarming only record the deadline: the watchdog's thread sleeps until the deadline it
// last saw and is woken early only when a deadline comes before it (or it has none). Its
// thread wakes about once per timeout, not twice per read (bench/RESULTS.md, "Issue 19:
// inline stream, part 2").
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class IdleWatchdog {
 public:
  IdleWatchdog() = default;
  // Joins the thread (if one was started).
  ~IdleWatchdog();
  IdleWatchdog(const IdleWatchdog&) = delete;
  IdleWatchdog& operator=(const IdleWatchdog&) = delete;

  // Cancels `ctx` if Disarm() is not called within `timeout` (> 0). `ctx` must stay valid
  // until Disarm(). Starts the watchdog's thread on first use. Wakes the thread only if it
  // sleeps past the new deadline.
  void Arm(grpc::ClientContext* ctx, std::chrono::milliseconds timeout);
  // Returns whether the deadline passed (and the call was cancelled) since Arm(). Never
  // wakes the thread.
  bool Disarm();
  // Times the thread has woken (tests: arming and disarming must not wake it each time).
  uint64_t wakeups() const;
  // Whether the deadline armed last has passed and its call was cancelled (tests).
  bool fired() const;

 private:
  using Clock = std::chrono::steady_clock;
  void Run();
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled, never a Condition: those are evaluated at every unlock
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  Clock::time_point deadline_ ABSL_GUARDED_BY(mu_);
  // When the thread wakes by itself (max(): it waits to be signalled).
  Clock::time_point wake_at_ ABSL_GUARDED_BY(mu_) = Clock::time_point::max();
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace conveyor
