#include "client/cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace conveyor::cli {

ProgressBar::ProgressBar(std::string label) : ProgressBar(std::move(label), ::isatty(2) == 1) {}

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
  last_draw_ = now;
  drawn_ = true;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int width = 30;
  const int fill = static_cast<int>(frac * width);
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? done / secs / 1e6 : 0;
  std::string bar(fill, '#');
  bar.resize(width, ' ');
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %.0f MB/s", label_.c_str(), bar.c_str(), frac * 100, rate);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace conveyor::cli
