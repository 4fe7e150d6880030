#include "client/cpp/idle_watchdog.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace conveyor {

IdleWatchdog::~IdleWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void IdleWatchdog::Arm(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  ctx_ = ctx;
  deadline_ = std::chrono::steady_clock::now() + timeout;
  fired_ = false;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

bool IdleWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  ctx_ = nullptr;
  return fired_;
}

void IdleWatchdog::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Await(absl::Condition(this, &IdleWatchdog::Woken));
    if (stop_) return;
    const auto left = deadline_ - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      ctx_->TryCancel();  // thread-safe; Read() returns false
      fired_ = true;
      ctx_ = nullptr;
      continue;
    }
    // Until the deadline, or until disarmed / re-armed / stopped.
    grpc::ClientContext* armed = ctx_;
    const auto deadline = deadline_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || ctx_ != armed || deadline_ != deadline; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), absl::FromChrono(left));
  }
}

}  // namespace conveyor
