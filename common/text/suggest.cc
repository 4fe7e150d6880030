#include "common/text/suggest.h"

#include <algorithm>
#include <cctype>

namespace conveyor {
namespace {

char Fold(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
  if (prefix.size() > s.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (Fold(s[i]) != Fold(prefix[i])) return false;
  return true;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic-programming table: transpositions look two rows back.
  std::vector<size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = Fold(a[i - 1]) == Fold(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && Fold(a[i - 1]) == Fold(b[j - 2]) && Fold(a[i - 2]) == Fold(b[j - 1]))
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestMatch(std::string_view given, const std::vector<std::string>& candidates) {
  if (given.empty()) return "";
  const size_t limit = std::clamp<size_t>(given.size() / 3, 1, 3);
  size_t best = limit + 1;
  const std::string* match = nullptr;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(given, c);
    if (d < best) {
      best = d;
      match = &c;
    }
  }
  if (match != nullptr) return *match;
  if (given.size() >= 3) {
    for (const std::string& c : candidates) {
      if (!StartsWithIgnoreCase(c, given)) continue;
      if (match != nullptr) return "";  // ambiguous
      match = &c;
    }
  }
  return match != nullptr ? *match : "";
}

std::string DidYouMean(std::string_view given, const std::vector<std::string>& candidates) {
  const std::string m = ClosestMatch(given, candidates);
  return m.empty() ? "" : " (did you mean '" + m + "'?)";
}

}  // namespace conveyor
