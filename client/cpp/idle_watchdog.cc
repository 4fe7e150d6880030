#include "client/cpp/idle_watchdog.h"

#include "absl/time/time.h"

namespace conveyor {

IdleWatchdog::~IdleWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void IdleWatchdog::Arm(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  ctx_ = ctx;
  deadline_ = Clock::now() + timeout;
  fired_ = false;
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { Run(); });
  } else if (wake_at_ > deadline_) {
    cv_.Signal();  // it would sleep past this deadline (or until signalled)
  }
}

bool IdleWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  ctx_ = nullptr;  // the thread finds nothing armed when it wakes at the last deadline
  return fired_;
}

uint64_t IdleWatchdog::wakeups() const {
  absl::MutexLock lock(&mu_);
  return wakeups_;
}

bool IdleWatchdog::fired() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

void IdleWatchdog::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    if (ctx_ != nullptr && now >= deadline_) {
      ctx_->TryCancel();  // thread-safe; Read() returns false
      fired_ = true;
      ctx_ = nullptr;
      continue;
    }
    if (now >= deadline_) {  // nothing armed since the last deadline passed
      wake_at_ = Clock::time_point::max();
      cv_.Wait(&mu_);
    } else {
      // Until the last deadline armed, armed still or not (disarmed, it is soon armed again,
      // later): a deadline armed meanwhile is checked then, an earlier one signals.
      wake_at_ = deadline_;
      cv_.WaitWithTimeout(&mu_, absl::FromChrono(deadline_ - now));
    }
    ++wakeups_;
  }
}

}  // namespace conveyor
