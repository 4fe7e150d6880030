// libFuzzer: arbitrary text as an rspecifier (first line) and scp range specifiers (each
// further line), each range applied to matrices of a few shapes. Parsing must end in a
// status; an accepted range must lie inside the matrix it was applied to.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/formats/kaldi/kaldi_table.h"

using namespace conveyor::kaldi;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  bool first = true;
  while (at <= text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    if (first) {
      (void)ParseRspecifier(line);
      first = false;
      continue;
    }
    auto range = ParseMatrixRange(line);
    if (!range.ok()) continue;
    for (int64_t rows : {0, 1, 7, 120}) {
      for (int64_t cols : {1, 40}) {
        bool clamped;
        auto w = ApplyRange(*range, rows, cols, &clamped);
        if (!w.ok()) continue;
        if (w->row0 < 0 || w->rows < 1 || w->row0 + w->rows > rows || w->col0 < 0 || w->cols < 1 ||
            w->col0 + w->cols > cols) {
          std::abort();
        }
      }
    }
  }
  return 0;
}
