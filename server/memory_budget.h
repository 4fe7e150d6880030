// memory_budget.h: byte budgets shared by the daemon's threads (the batches in flight of
// every subscription), reserved before allocating and released after freeing, and the
// return of freed memory to the system once a subscription ends.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class MemoryBudget {
 public:
  // `description` and `key` name the budget in errors, e.g. "the daemon's budget for
  // batches in flight" and "server.inFlightBytes".
  MemoryBudget(std::string description, std::string key, uint64_t limit);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` of the budget. Errors: ResourceExhausted naming the budget, what is left
  // and `what` (e.g. "a batch of 4096 bytes") when they do not fit. Thread-safe.
  absl::Status Reserve(uint64_t bytes, absl::string_view what);
  // Gives back bytes reserved before. Thread-safe.
  void Release(uint64_t bytes);
  uint64_t used() const;
  uint64_t limit() const { return limit_; }
  const std::string& key() const { return key_; }

 private:
  const std::string description_, key_;
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bytes held of a budget, given back on destruction (movable, not copyable).
class Reservation {
 public:
  Reservation() = default;
  Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.bytes_ = 0; }
  Reservation& operator=(Reservation&& o) noexcept;
  ~Reservation() { Reset(); }
  void Reset();
  uint64_t bytes() const { return bytes_; }

 private:
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// Half of the machine's physical memory: the default of the daemon-wide budgets.
uint64_t DefaultDaemonBudget();

// Gives freed memory back to the system now, on this thread: the heap's (malloc_trim) and the
// large arrays' blocks kept for reuse (common/huge_pages.h).
void ReleaseFreedMemory();

// ReleaseFreedMemory() on a thread of its own, so that what a finished subscription held
// leaves the daemon's RSS: the allocator is tuned to keep
// freed chunk buffers for reuse (common/malloc_tuning.h), which would otherwise hold the
// peak of the largest subscription forever. Request() never blocks; requests coalesce.
class MemoryReleaser {
 public:
  MemoryReleaser();
  ~MemoryReleaser();
  MemoryReleaser(const MemoryReleaser&) = delete;
  MemoryReleaser& operator=(const MemoryReleaser&) = delete;
  void Request();

 private:
  void Run();
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || requested_; }
  absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace conveyor
