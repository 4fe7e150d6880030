// file_path.h: path arithmetic on strings that never throws (std::filesystem throws on user
// input such as a component longer than NAME_MAX, and we read paths from data files).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace conveyor {

// `rel` under `dir` ("a/b" + "c" = "a/b/c"); `rel` itself when it is absolute or `dir` is empty.
std::string JoinPath(std::string_view dir, std::string_view rel);

// The directory part of `path` ("a/b/c" -> "a/b", "c" -> "", "/c" -> "/").
std::string ParentDir(std::string_view path);

bool IsAbsolutePath(std::string_view path);

// True when `path` names something stat() can see; false on any error (missing, too long,
// no permission), never an exception.
bool PathExists(const std::string& path);

// Resolves a relative `path` against each of `dirs` in turn: the first that exists, else the
// first candidate (so that the error opening it names a real place). Absolute paths and
// empty `dirs` give `path` unchanged.
std::string ResolveAgainst(const std::string& path, const std::vector<std::string>& dirs);

}  // namespace conveyor
