#include "common/config/config_tree.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {

const ConfigNode* ConfigNode::Get(std::string_view key) const {
  for (const auto& [k, v] : map)
    if (absl::EqualsIgnoreCase(k, absl::string_view(key.data(), key.size()))) return &v;
  return nullptr;
}

// ---------------------------------------------------------------- YAML

namespace {

// YAML aliases make the document a graph: `a: &a [*a]` refers to itself, and a few hundred
// bytes of aliases to aliases stand for billions of nodes. The conversion to a tree walks
// that graph, so it is bounded in depth and in the nodes it creates.
struct YamlWalk {
  const std::string& source;
  size_t nodes_left;
};

absl::Status YamlTooBig(const YAML::Node& n, const YamlWalk& walk, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(walk.source, ":", n.Mark().line + 1, ":", n.Mark().column + 1, ": ",
                                                 what));
}

absl::StatusOr<ConfigNode> FromYaml(const YAML::Node& n, YamlWalk& walk, int depth) {
  if (depth > kMaxYamlDepth) {
    return YamlTooBig(n, walk, absl::StrCat("the configuration nests deeper than ", kMaxYamlDepth,
                                            " levels (does a YAML alias refer to a block that contains it?)"));
  }
  if (walk.nodes_left == 0) {
    return YamlTooBig(n, walk, "the configuration expands to too many values (YAML aliases repeating aliases?); "
                               "write the blocks out instead");
  }
  --walk.nodes_left;
  ConfigNode out;
  out.line = n.Mark().line + 1;
  out.column = n.Mark().column + 1;
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      out.kind = ConfigNode::Kind::kNull;
      return out;
    case YAML::NodeType::Scalar:
      out.kind = ConfigNode::Kind::kScalar;
      out.scalar = n.Scalar();
      return out;
    case YAML::NodeType::Sequence:
      out.kind = ConfigNode::Kind::kList;
      for (const auto& item : n) {
        ASSIGN_OR_RETURN(ConfigNode child, FromYaml(item, walk, depth + 1));
        out.list.push_back(std::move(child));
      }
      return out;
    case YAML::NodeType::Map:
      out.kind = ConfigNode::Kind::kMap;
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(walk.source, ":", kv.first.Mark().line + 1,
                                                         ":", kv.first.Mark().column + 1,
                                                         ": expected a plain key"));
        }
        const std::string key = kv.first.Scalar();
        if (out.Get(key) != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(walk.source, ":", kv.first.Mark().line + 1,
                                                         ":", kv.first.Mark().column + 1,
                                                         ": duplicate key '", key, "'"));
        }
        ASSIGN_OR_RETURN(ConfigNode child, FromYaml(kv.second, walk, depth + 1));
        if (child.line == 0) child.line = kv.first.Mark().line + 1;
        out.map.emplace_back(key, std::move(child));
      }
      return out;
  }
  return out;
}

}  // namespace

absl::StatusOr<ConfigNode> ParseYamlConfig(std::string_view text, const std::string& source) {
  try {
    YAML::Node root = YAML::Load(std::string(text));
    // Without aliases a document has fewer values than bytes; aliases may reuse blocks a
    // few times over, not without bound.
    YamlWalk walk{source, 4 * text.size() + 4096};
    return FromYaml(root, walk, 0);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": ", e.msg));
  }
}

// ---------------------------------------------------------------- BrainScript

namespace {

class BrainScriptParser {
 public:
  BrainScriptParser(std::string_view text, const std::string& source)
      : text_(text), source_(source) {}

  absl::StatusOr<ConfigNode> ParseTop() {
    ConfigNode root;
    root.kind = ConfigNode::Kind::kMap;
    root.line = 1;
    root.column = 1;
    RETURN_IF_ERROR(ParseEntries(&root, '\0'));
    ResolveReferences(&root, root);
    return root;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line_, ":", Column(), ": ", what));
  }
  int Column() const { return static_cast<int>(pos_ - line_start_) + 1; }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  void Advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      line_start_ = pos_ + 1;
    }
    ++pos_;
  }
  // Skips spaces, tabs, CR and comments; newlines too when `newlines` is set.
  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      char c = Peek();
      if (c == '#' || (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/')) {
        while (!AtEnd() && Peek() != '\n') Advance();
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
        // BrainScript block comment.
        Advance();
        Advance();
        while (!AtEnd() && !(Peek() == '*' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/')) Advance();
        if (!AtEnd()) {
          Advance();
          Advance();
        }
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        Advance();
      } else {
        break;
      }
    }
  }
  static bool IsNameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  }

  // Entries `name = value` until `close` (or end of text for '\0').
  absl::Status ParseEntries(ConfigNode* map, char close) {
    while (true) {
      SkipSpace(true);
      while (Peek() == ';' || Peek() == ',') {
        Advance();
        SkipSpace(true);
      }
      if (AtEnd()) {
        if (close != '\0') return Error(absl::StrCat("expected '", std::string(1, close), "' before the end of the file"));
        return absl::OkStatus();
      }
      if (Peek() == close) {
        Advance();
        return absl::OkStatus();
      }
      const int key_line = line_, key_col = Column();
      std::string key;
      while (!AtEnd() && IsNameChar(Peek())) {
        key.push_back(Peek());
        Advance();
      }
      if (key.empty()) return Error(absl::StrCat("expected a parameter name, found '", std::string(1, Peek()), "'"));
      SkipSpace(false);
      if (Peek() != '=') return Error(absl::StrCat("expected '=' after '", key, "'"));
      Advance();
      SkipSpace(false);
      if (absl::EndsWithIgnoreCase(key, "NetworkBuilder") && (Peek() == '[' || Peek() == '{')) {
        // A network definition (BrainScript functions and expressions): not a loader's
        // business; skipped to its matching bracket, comments and quotes respected.
        ConfigNode skipped;
        skipped.line = key_line;
        skipped.column = key_col;
        skipped.scalar = "<network definition>";
        if (!ScanRaw(/*one_block=*/true)) return Error(absl::StrCat("the block '", key, "' is not closed"));
        map->map.emplace_back(key, std::move(skipped));
        continue;
      }
      const size_t value_pos = pos_;
      const int value_line = line_;
      const size_t value_line_start = line_start_;
      absl::StatusOr<ConfigNode> parsed = ParseValue(close);
      if (parsed.ok()) SkipSpace(false);
      if (!parsed.ok() || (!AtEnd() && Peek() != '\n' && Peek() != ';' && Peek() != ',' && Peek() != close)) {
        // A BrainScript expression (network definitions: `11 * baseFeatDim`, `Input(...)`):
        // kept as its text, up to the end of the line outside brackets and quotes.
        pos_ = value_pos;
        line_ = value_line;
        line_start_ = value_line_start;
        ConfigNode expr;
        expr.line = line_;
        expr.column = Column();
        std::optional<std::string> text = ScanRaw(/*one_block=*/false);
        if (!text) {
          if (!parsed.ok()) return parsed.status();
          return Error(absl::StrCat("unbalanced brackets or quotes in the value of '", key, "'"));
        }
        expr.scalar = std::move(*text);
        while (!expr.scalar.empty() && (expr.scalar.back() == ' ' || expr.scalar.back() == '\t' || expr.scalar.back() == '\r'))
          expr.scalar.pop_back();
        parsed = std::move(expr);
      }
      ConfigNode value = std::move(*parsed);
      value.line = key_line;
      value.column = key_col;
      // A later assignment of the same name overrides an earlier one, as in CNTK.
      bool replaced = false;
      for (auto& [k, v] : map->map) {
        if (absl::EqualsIgnoreCase(k, key)) {
          v = std::move(value);
          replaced = true;
          break;
        }
      }
      if (!replaced) map->map.emplace_back(key, std::move(value));
    }
  }

  // Raw BrainScript text the loader does not model, quotes and comments respected (comments
  // are left out). one_block: from an opening bracket through its match; else an expression,
  // up to the end of its line (or ';', a comment, an unmatched closing bracket) outside
  // brackets. nullopt when brackets or quotes are unbalanced at the end of the text.
  std::optional<std::string> ScanRaw(bool one_block) {
    std::string out;
    int depth = 0;
    char quote = 0;
    while (!AtEnd()) {
      const char ch = Peek();
      const bool comment = !quote && (ch == '#' || (ch == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/'));
      if (!one_block && depth == 0 && !quote && (comment || ch == '\n' || ch == ';')) return out;
      if (comment) {
        while (!AtEnd() && Peek() != '\n') Advance();
        continue;
      }
      if (quote) {
        if (ch == quote) quote = 0;
      } else if (ch == '"' || ch == '\'') {
        quote = ch;
      } else if (ch == '(' || ch == '[' || ch == '{') {
        ++depth;
      } else if (ch == ')' || ch == ']' || ch == '}') {
        if (depth == 0) return out;  // an expression inside the caller's brackets ends here
        if (--depth == 0 && one_block) {
          Advance();
          return out;
        }
      }
      out.push_back(ch);
      Advance();
    }
    if (quote || depth > 0) return std::nullopt;
    return out;
  }

  absl::StatusOr<ConfigNode> ParseValue(char enclosing_close) {
    ConfigNode node;
    node.line = line_;
    node.column = Column();
    char c = Peek();
    if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      Advance();
      node.kind = ConfigNode::Kind::kMap;
      RETURN_IF_ERROR(ParseEntries(&node, close));
      return node;
    }
    if (c == '(') {
      Advance();
      node.kind = ConfigNode::Kind::kList;
      while (true) {
        SkipSpace(true);
        if (Peek() == ')') {
          Advance();
          return node;
        }
        if (AtEnd()) return Error("expected ')' to close the array");
        ASSIGN_OR_RETURN(ConfigNode item, ParseValue(')'));
        node.list.push_back(std::move(item));
        SkipSpace(true);
        if (Peek() == ':') Advance();
      }
    }
    node.kind = ConfigNode::Kind::kScalar;
    if (c == '"' || c == '\'') {
      const char quote = c;
      Advance();
      while (!AtEnd() && Peek() != quote && Peek() != '\n') {
        node.scalar.push_back(Peek());
        Advance();
      }
      if (Peek() != quote) return Error(absl::StrCat("expected a closing ", std::string(1, quote)));
      Advance();
      return node;
    }
    // Bare token: up to whitespace, a separator or the enclosing bracket.
    while (!AtEnd()) {
      c = Peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ';' || c == '#' || c == ']' ||
          c == '}' || c == ')' || (enclosing_close == ')' && c == ':'))
        break;
      node.scalar.push_back(c);
      Advance();
    }
    if (node.scalar.empty()) return Error("expected a value");
    (void)enclosing_close;
    return node;
  }

  // Replaces `$name$` in scalars by the top-level scalar called `name`.
  void ResolveReferences(ConfigNode* node, const ConfigNode& root) {
    if (node->kind == ConfigNode::Kind::kScalar) {
      std::string& s = node->scalar;
      size_t p = 0;
      while ((p = s.find('$', p)) != std::string::npos) {
        size_t q = s.find('$', p + 1);
        if (q == std::string::npos) break;
        const ConfigNode* ref = root.Get(s.substr(p + 1, q - p - 1));
        if (ref == nullptr || ref->kind != ConfigNode::Kind::kScalar) {
          p = q;
          continue;
        }
        s.replace(p, q - p + 1, ref->scalar);
        p += ref->scalar.size();
      }
      return;
    }
    for (auto& [k, v] : node->map) ResolveReferences(&v, root);
    for (auto& v : node->list) ResolveReferences(&v, root);
  }

  const std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
  size_t line_start_ = 0;
  int line_ = 1;
};

}  // namespace

absl::StatusOr<ConfigNode> ParseBrainScript(std::string_view text, const std::string& source) {
  return BrainScriptParser(text, source).ParseTop();
}

bool LooksLikeBrainScript(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t i = 0;
    while (i < line.size() &&
           (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == '.'))
      ++i;
    if (i == 0) return false;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    return i < line.size() && line[i] == '=';
  }
  return false;
}

}  // namespace conveyor
