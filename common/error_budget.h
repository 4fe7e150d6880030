// error_budget.h: maxErrors as CNTK defines it, a budget of input errors for a dataset's
// lifetime. Each bad sequence (or blank row) spends one unit; once more than `max_errors`
// were spent, reading stops with the error that broke the budget. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace conveyor {

class ErrorBudget {
 public:
  explicit ErrorBudget(uint64_t max_errors) : max_errors_(max_errors) {}
  ErrorBudget(const ErrorBudget&) = delete;
  ErrorBudget& operator=(const ErrorBudget&) = delete;

  // Spends `n` units; returns false when the total now exceeds the budget.
  bool Spend(uint64_t n = 1) { return spent_.fetch_add(n) + n <= max_errors_; }
  uint64_t spent() const { return spent_.load(); }
  // Gives back `n` units spent by a pass that does not count (a scan before reading).
  void Refund(uint64_t n) { spent_.fetch_sub(n); }
  uint64_t max_errors() const { return max_errors_; }

 private:
  const uint64_t max_errors_;
  std::atomic<uint64_t> spent_{0};
};

}  // namespace conveyor
