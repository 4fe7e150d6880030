// log.h: the diagnostics sink shared by parsers and the CLI. Warnings obey traceLevel
// (0: errors only, 1: + warnings, 2: + info) and are rate-limited per kind so that a file
// with a million short samples prints ten lines and a count, not a million.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

enum class Severity { kError = 0, kWarning = 1, kInfo = 2 };

// Thread-safe. Messages go to `sink` (stderr by default) as "WARNING: text" lines.
class Diagnostics {
 public:
  using Sink = std::function<void(Severity, const std::string&)>;
  explicit Diagnostics(int trace_level = 1, Sink sink = nullptr);

  // Reports `text`. `kind` groups messages for rate limiting: after `kPerKindLimit` messages
  // of one kind, further ones are only counted and summarized by Flush().
  void Report(Severity severity, const std::string& kind, const std::string& text);
  // Prints one line per rate-limited kind ("... and N more <kind> warnings").
  void Flush();
  int trace_level() const { return trace_level_; }
  uint64_t warnings() const { return warnings_.load(); }

  static constexpr int kPerKindLimit = 10;

 private:
  const int trace_level_;
  const Sink sink_;
  std::atomic<uint64_t> warnings_{0};
  absl::Mutex mu_;
  std::map<std::string, uint64_t> per_kind_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor
