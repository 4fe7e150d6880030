#include "common/formats/deserializer.h"

#include "absl/strings/str_cat.h"

namespace conveyor {

// Defaults of the chunk-level calls, for deserializers read by key only.
absl::StatusOr<std::unique_ptr<ParsedChunk>> Deserializer::ParseChunk(uint64_t) const {
  return absl::UnimplementedError(absl::StrCat(description(), " is read by key, not by chunk"));
}

const std::string& Deserializer::index_cache_path() const {
  static const std::string* const kNone = new std::string;
  return *kNone;
}

}  // namespace conveyor
