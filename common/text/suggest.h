// suggest.h: "did you mean ...?" for names a person mistyped (configuration keys, commands,
// options). Pure functions; no allocation beyond the returned strings.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace conveyor {

// The candidate closest to `given`, compared without regard to ASCII case: within an edit
// distance (insertions, deletions, substitutions, adjacent transpositions) of about a third
// of its length (at least 1, at most 3), or the only candidate that `given` (3+ characters)
// begins. Ties go to the earlier candidate. Empty when none is close enough.
std::string ClosestMatch(std::string_view given, const std::vector<std::string>& candidates);

// " (did you mean 'X'?)" for ClosestMatch(given, candidates), or "" when there is none:
// ready to append to an error message.
std::string DidYouMean(std::string_view given, const std::vector<std::string>& candidates);

// Optimal-string-alignment distance between `a` and `b`, ignoring ASCII case.
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace conveyor
