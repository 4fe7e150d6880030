// error_budget.h: maxErrors as CNTK defines it, a budget of input errors for a dataset's
// lifetime. Each bad sequence (or blank row) spends one unit; once more than `max_errors`
// were spent, reading stops with the error that broke the budget. Thread-safe.
//
// A bad sequence counts once however often it is read: a chunk parsed again (a later epoch,
// another subscription, a chunk dropped from the cache and read again) meets the same bad
// sequences, in the same order, as its first parse. A ChunkScope around a chunk's parse
// makes the errors that chunk already spent free (they still fail once the budget is
// broken), and records what it spends beyond them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace conveyor {

class ErrorBudget {
 public:
  explicit ErrorBudget(uint64_t max_errors) : max_errors_(max_errors) {}
  ErrorBudget(const ErrorBudget&) = delete;
  ErrorBudget& operator=(const ErrorBudget&) = delete;

  // Chunk `chunk`'s parse on this thread, from construction to destruction (no nesting of
  // scopes of one budget on one thread).
  class ChunkScope {
   public:
    ChunkScope(ErrorBudget* budget, uint64_t chunk) : budget_(budget), chunk_(chunk), outer_(current_) {
      std::lock_guard<std::mutex> lock(budget_->mu_);
      auto it = budget_->by_chunk_.find(chunk_);
      allowance_ = it == budget_->by_chunk_.end() ? 0 : it->second;
      broken_before_ = budget_->spent_.load() > budget_->max_errors_;
      current_ = this;
    }
    ~ChunkScope() {
      current_ = outer_;
      std::lock_guard<std::mutex> lock(budget_->mu_);
      uint64_t& recorded = budget_->by_chunk_[chunk_];
      recorded = std::max(recorded, counted_);
    }
    ChunkScope(const ChunkScope&) = delete;
    ChunkScope& operator=(const ChunkScope&) = delete;

   private:
    friend class ErrorBudget;
    ErrorBudget* const budget_;
    const uint64_t chunk_;
    ChunkScope* const outer_;
    uint64_t allowance_ = 0;  // errors of this chunk counted by an earlier parse, not met again yet
    uint64_t counted_ = 0;    // errors met by this parse
    bool broken_before_ = false;  // the budget was broken when this parse began
  };

  // Spends `n` units; returns false when the total now exceeds the budget (or, for errors a
  // ChunkScope's chunk already spent, when the budget is already broken).
  bool Spend(uint64_t n = 1) {
    ChunkScope* s = current_;
    if (s != nullptr && s->budget_ == this) {
      const uint64_t free = std::min(n, s->allowance_);
      s->allowance_ -= free;
      s->counted_ += n;
      n -= free;
      if (n == 0) return spent_.load() <= max_errors_;
    }
    return spent_.fetch_add(n) + n <= max_errors_;
  }
  uint64_t spent() const { return spent_.load(); }
  // Gives back `n` units spent by a pass that does not count (a scan before reading).
  void Refund(uint64_t n) { spent_.fetch_sub(n); }
  uint64_t max_errors() const { return max_errors_; }

  // What a reader stops with at `error`, which Spend() refused: `error` and the budget it
  // broke; or, where the budget was broken before this chunk's parse began (an earlier read,
  // another subscription, so that this error, counted then, is refused now), the error that
  // broke it and that it stays broken while the dataset is open. Parses running at the same
  // time as the one that broke it get the first message: whichever thread got there first,
  // neither error was refused "earlier".
  std::string Exceeded(const std::string& error) {
    const ChunkScope* s = current_;
    const bool earlier = s != nullptr && s->budget_ == this && s->broken_before_;
    std::string first;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!earlier && broken_by_.empty()) broken_by_ = error;
      first = broken_by_;
    }
    const std::string limit = "maxErrors=" + std::to_string(max_errors_);
    if (!earlier || first.empty() || first == error) {
      return error + " (more than " + limit + " input errors; raise maxErrors to skip bad sequences)";
    }
    return error + " (the dataset's " + limit + " was exceeded earlier, first by: " + first +
           "; while the dataset stays open every input error stops reading: fix the data or raise maxErrors, then "
           "open the dataset again (a daemon: restart it))";
  }

 private:
  static inline thread_local ChunkScope* current_ = nullptr;
  const uint64_t max_errors_;
  std::atomic<uint64_t> spent_{0};
  std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> by_chunk_;  // errors each chunk's parses met, at most
  std::string broken_by_;                            // the error that broke the budget (Exceeded)
};

}  // namespace conveyor
