#include "common/formats/registry.h"

#include "absl/strings/str_cat.h"
#include "common/config/deserializer_types.h"

namespace conveyor {

namespace {

// The built-in formats registered before main(), so that the config loader knows their
// names before any dataset is opened. (This file is linked wherever Dataset is.)
[[maybe_unused]] const bool kBuiltinsRegistered = (DeserializerRegistry::Global(), true);

}  // namespace

DeserializerRegistry& DeserializerRegistry::Global() {
  static DeserializerRegistry* registry = [] {
    auto* r = new DeserializerRegistry;
    RegisterBuiltinFormats(*r);
    return r;
  }();
  return *registry;
}

void DeserializerRegistry::Register(std::string type, DeserializerFactory factory) {
  AddDeserializerTypeName(type);  // so that the config loader accepts the name
  for (auto& [name, f] : factories_) {
    if (name == type) {
      f = factory;
      return;
    }
  }
  factories_.emplace_back(std::move(type), factory);
}

DeserializerFactory DeserializerRegistry::Find(std::string_view type) const {
  for (const auto& [name, f] : factories_)
    if (name == type) return f;
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Deserializer>> DeserializerRegistry::Open(const DeserializerContext& context) const {
  const DeserializerFactory factory = Find(context.config.type);
  if (factory == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("deserializer type '", context.config.type, "' is not supported by this build"));
  }
  return factory(context);
}

}  // namespace conveyor
