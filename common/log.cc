#include "common/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {
const char* Prefix(Severity s) {
  switch (s) {
    case Severity::kError:
      return "ERROR: ";
    case Severity::kWarning:
      return "WARNING: ";
    case Severity::kInfo:
      return "INFO: ";
  }
  return "";
}
}  // namespace

Diagnostics::Diagnostics(int trace_level, Sink sink)
    : trace_level_(trace_level),
      sink_(sink ? std::move(sink) : Sink([](Severity s, const std::string& text) {
        std::fprintf(stderr, "%s%s\n", Prefix(s), text.c_str());
      })) {}

void Diagnostics::Report(Severity severity, const std::string& kind, const std::string& text) {
  if (severity == Severity::kWarning) warnings_.fetch_add(1);
  if (static_cast<int>(severity) > trace_level_) return;
  {
    absl::MutexLock lock(&mu_);
    if (++per_kind_[kind] > kPerKindLimit) return;
  }
  sink_(severity, text);
}

void Diagnostics::Flush() {
  absl::MutexLock lock(&mu_);
  for (auto& [kind, count] : per_kind_) {
    if (count > kPerKindLimit) {
      sink_(Severity::kWarning, absl::StrCat("... and ", count - kPerKindLimit, " more '", kind,
                                             "' messages (not shown)"));
    }
    count = 0;
  }
}

}  // namespace conveyor
