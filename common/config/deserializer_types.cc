#include "common/config/deserializer_types.h"

#include <cctype>
#include <mutex>
#include <vector>


namespace conveyor {
namespace {

struct Names {
  std::mutex mu;
  std::vector<std::string> names;
};

Names& Table() {
  static Names* names = new Names;
  return *names;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

}  // namespace

void AddDeserializerTypeName(std::string type) {
  Names& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const std::string& n : t.names)
    if (n == type) return;
  t.names.push_back(std::move(type));
}

std::optional<std::string> FindDeserializerTypeName(std::string_view type) {
  Names& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const std::string& n : t.names)
    if (EqualsIgnoreCase(n, type)) return n;
  return std::nullopt;
}

}  // namespace conveyor
