#include "common/config/dataset_config.h"

#include "absl/strings/str_join.h"

namespace conveyor {

const char* DistributionName(Distribution d) { return d == Distribution::kChunks ? "chunks" : "balanced"; }

const char* StreamFormatName(StreamFormat f) {
  switch (f) {
    case StreamFormat::kDense:
      return "dense";
    case StreamFormat::kSparse:
      return "sparse";
    case StreamFormat::kIds:
      return "ids";
  }
  return "?";
}

uint64_t DatasetConfig::EffectiveMaxErrors() const {
  for (const auto& d : deserializers)
    if (d.max_errors) return *d.max_errors;
  return max_errors;
}

int DatasetConfig::EffectiveTraceLevel() const {
  for (const auto& d : deserializers)
    if (d.trace_level) return *d.trace_level;
  return trace_level;
}

std::vector<StreamConfig> DatasetConfig::AllStreams() const {
  std::vector<StreamConfig> out;
  for (const auto& d : deserializers) out.insert(out.end(), d.streams.begin(), d.streams.end());
  return out;
}

const DatasetConfig* Config::Find(const std::string& name) const {
  for (const auto& d : datasets)
    if (d.name == name) return &d;
  return nullptr;
}

std::string Config::DatasetNames() const {
  std::vector<std::string> names;
  for (const auto& d : datasets) names.push_back(d.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace conveyor
