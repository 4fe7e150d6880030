// idle_watchdog.h: cancels a gRPC call that has been waiting for a message longer than its
// idle deadline (a daemon that is wedged, or whose host vanished without the connection
// noticing), so that the client fails over instead of waiting for TCP to give up.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
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
  // until Disarm(). Starts the watchdog's thread on first use.
  void Arm(grpc::ClientContext* ctx, std::chrono::milliseconds timeout);
  // Returns whether the deadline passed (and the call was cancelled) since Arm().
  bool Disarm();

 private:
  void Run();
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || ctx_ != nullptr; }
  absl::Mutex mu_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::chrono::steady_clock::time_point deadline_ ABSL_GUARDED_BY(mu_);
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace conveyor
