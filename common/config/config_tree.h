// config_tree.h: a small generic tree (maps, lists, scalars, each with its source line and
// column) that both configuration syntaxes parse into: YAML/JSON via yaml-cpp and CNTK's
// BrainScript reader blocks via ParseBrainScript(). config_loader.cc turns it into a Config.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

struct ConfigNode {
  enum class Kind { kNull, kScalar, kMap, kList };
  Kind kind = Kind::kNull;
  std::string scalar;
  std::vector<std::pair<std::string, ConfigNode>> map;  // insertion order kept
  std::vector<ConfigNode> list;
  int line = 0;  // 1-based; 0 when unknown
  int column = 0;

  bool is_map() const { return kind == Kind::kMap; }
  // The entry whose key equals `key` ignoring ASCII case; nullptr if none.
  const ConfigNode* Get(std::string_view key) const;
};

// Deepest nesting of a YAML document's values (aliases followed).
inline constexpr int kMaxYamlDepth = 64;

// Parses YAML (JSON is YAML). Aliases are followed, at most kMaxYamlDepth levels deep and
// to at most 4 values per byte of text (an alias that contains itself, or an alias bomb, is
// an error). Errors: InvalidArgument "SOURCE:LINE:COL: message".
absl::StatusOr<ConfigNode> ParseYamlConfig(std::string_view text, const std::string& source);

// Parses a CNTK BrainScript configuration: `name = value` entries separated by newlines or
// `;`, blocks `[ ... ]` / `{ ... }`, arrays `( a : b )`, quoted or bare scalars, `#`
// comments, and `$name$` references to top-level scalars (case-insensitive).
// Errors: InvalidArgument "SOURCE:LINE:COL: expected ...".
absl::StatusOr<ConfigNode> ParseBrainScript(std::string_view text, const std::string& source);

// True when `text` looks like BrainScript rather than YAML: its first significant line
// has the form `name = ...`.
bool LooksLikeBrainScript(std::string_view text);

}  // namespace conveyor
