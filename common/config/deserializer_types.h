// deserializer_types.h: the deserializer type names configurations may use beyond the
// built-in ones the config loader spells out itself (CNTKTextFormat, CNTKBinary, HTKFeature,
// HTKMLF, KaldiTable and their BrainScript names). DeserializerRegistry::Register
// (formats/registry.h) adds every registered name here, so that a format added by one
// registration line is also accepted by the loader; nothing else should call Add.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace conveyor {

// Adds `type` (kept as spelled). Thread-safe.
void AddDeserializerTypeName(std::string type);
// The registered name equal to `type` ignoring ASCII case, if any. Thread-safe.
std::optional<std::string> FindDeserializerTypeName(std::string_view type);

}  // namespace conveyor
