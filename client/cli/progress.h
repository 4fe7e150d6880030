// progress.h: a one-line progress bar on stderr, drawn only when stderr is a terminal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace conveyor::cli {

class ProgressBar {
 public:
  // `label` prefixes the bar; `enabled` false draws nothing (default: isatty(stderr)).
  explicit ProgressBar(std::string label);
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();
  // Thread-safe; redraws at most ten times a second.
  void Update(uint64_t done, uint64_t total);
  // Clears the line.
  void Finish();

 private:
  const std::string label_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace conveyor::cli
