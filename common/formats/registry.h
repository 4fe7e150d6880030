// registry.h: deserializers by type name (DALI's operator registry, CNTK's deserializer
// factory by `type`). Each format registers its factory once, by the name configurations use
// (`CNTKTextFormat`, `CNTKBinary`, `HTKFeature`, `HTKMLF`, `KaldiTable`; the config loader
// maps BrainScript's names onto these). The built-in formats are listed in
// builtin_formats.cc, one line each: an explicit list, because registration by static
// initializers is dropped by static linking.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/formats/deserializer.h"

namespace conveyor {

class DeserializerRegistry {
 public:
  // The registry with every built-in format (builtin_formats.cc) and whatever was added
  // since. Thread-safe to read; Register before opening datasets (not thread-safe).
  static DeserializerRegistry& Global();

  // Adds (or replaces) the factory for `type`.
  void Register(std::string type, DeserializerFactory factory);
  // Null when no format of that name is registered.
  DeserializerFactory Find(std::string_view type) const;
  // Opens `context.config` with the factory of its type. Errors: Unimplemented for a type
  // this build lacks; the factory's own.
  absl::StatusOr<std::unique_ptr<Deserializer>> Open(const DeserializerContext& context) const;

 private:
  std::vector<std::pair<std::string, DeserializerFactory>> factories_;
};

// Registers the formats built into conveyor (builtin_formats.cc).
void RegisterBuiltinFormats(DeserializerRegistry& registry);

}  // namespace conveyor
