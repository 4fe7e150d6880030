#include "common/file_path.h"

#include <sys/stat.h>

namespace conveyor {

bool IsAbsolutePath(std::string_view path) { return !path.empty() && path.front() == '/'; }

std::string JoinPath(std::string_view dir, std::string_view rel) {
  if (dir.empty() || IsAbsolutePath(rel)) return std::string(rel);
  std::string out(dir);
  if (out.back() != '/') out.push_back('/');
  out.append(rel);
  return out;
}

std::string ParentDir(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return "";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string ResolveAgainst(const std::string& path, const std::vector<std::string>& dirs) {
  if (IsAbsolutePath(path) || dirs.empty()) return path;
  for (const std::string& dir : dirs) {
    std::string candidate = JoinPath(dir, path);
    if (PathExists(candidate)) return candidate;
  }
  return JoinPath(dirs.front(), path);
}

}  // namespace conveyor
