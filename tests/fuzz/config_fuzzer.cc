// libFuzzer harness: any bytes as a configuration (YAML/JSON or BrainScript). Must never
// crash or hang; a loaded configuration must satisfy the loader's promises.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/config/config_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace conveyor;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfig(text, "fuzz.yaml", "/data/");
  if (!config.ok()) return 0;
  for (const DatasetConfig& d : config->datasets) {
    if (d.deserializers.empty()) std::abort();
    int defining = 0;
    for (const StreamConfig& s : d.AllStreams()) {
      if (s.alias.empty()) std::abort();
      if (s.format != StreamFormat::kIds && (s.dim == 0 || s.dim > kMaxDim)) std::abort();
      defining += s.defines_mb_size;
    }
    if (defining > 1) std::abort();
  }
  return 0;
}
