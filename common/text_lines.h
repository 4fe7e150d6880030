// text_lines.h: small text helpers the line-oriented formats share (Kaldi scp files, HTK
// scp files, MLFs, label lists): C-locale whitespace, trimming, line iteration with line
// numbers, and the bridge to absl::StrCat, whose string_view this absl does not alias to
// std::string_view.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/strings/string_view.h"

namespace conveyor {

inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// C-locale isspace (NUL is not whitespace).
inline bool IsCSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

inline std::string_view TrimCSpace(std::string_view s) {
  while (!s.empty() && IsCSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsCSpace(s.back())) s.remove_suffix(1);
  return s;
}

// The lines of `text` ('\n'-separated; a final line without '\n' counts), numbered from 1.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}
  // The next line, without its '\n'; false at the end.
  bool Next(std::string_view* line) {
    if (at_ >= text_.size()) return false;
    size_t eol = text_.find('\n', at_);
    if (eol == std::string_view::npos) eol = text_.size();
    *line = text_.substr(at_, eol - at_);
    at_ = eol + 1;
    ++line_no_;
    return true;
  }
  uint64_t line_no() const { return line_no_; }
  uint64_t offset() const { return at_ < text_.size() ? at_ : text_.size(); }  // bytes consumed

 private:
  std::string_view text_;
  size_t at_ = 0;
  uint64_t line_no_ = 0;
};

}  // namespace conveyor
