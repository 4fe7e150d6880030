// config_loader.h: loads a conveyor configuration (docs/design.md section 3) from a file or text.
// YAML and JSON use the `datasets:` layout; a CNTK BrainScript file with a `reader = [...]`
// block gives a dataset named `reader`, and each top-level `NAME = [ ... reader = [...] ]`
// block (the layout of CNTK's reader test configs) gives a dataset named NAME.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"

namespace conveyor {

// Reads and parses `path`. Relative data paths are resolved against the file's directory.
// Errors: NotFound (no such file), InvalidArgument "PATH:LINE:COL: what was expected".
absl::StatusOr<Config> LoadConfigFile(const std::string& path);

// Parses `text`; `source` names it in messages and `base_dir` resolves relative paths.
absl::StatusOr<Config> ParseConfig(std::string_view text, const std::string& source,
                                   const std::string& base_dir);

// The keys each block of a YAML/JSON configuration accepts, spelled as documented: what an
// unknown key's "did you mean" is chosen from.
struct ConfigKeys {
  std::vector<std::string> top, tls, server, dataset, deserializer, stream;
};
const ConfigKeys& KnownConfigKeys();

// Hard limits on what a configuration may ask for.
inline constexpr uint64_t kMaxDim = (1ull << 31) - 1;  // sparse row indices are int32
inline constexpr uint64_t kMinChunkSizeInBytes = 1;
inline constexpr size_t kMaxConfigBytes = 1u << 20;
inline constexpr int kMaxConfigNesting = 64;

}  // namespace conveyor
