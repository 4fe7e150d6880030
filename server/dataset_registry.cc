#include "server/dataset_registry.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<DatasetRegistry>> DatasetRegistry::Open(const Config& config, int index_threads,
                                                                       bool compressed_in_place) {
  auto r = std::unique_ptr<DatasetRegistry>(new DatasetRegistry());
  for (const DatasetConfig& dc : config.datasets) {
    DatasetOpenOptions o;
    o.index_threads = index_threads;
    o.compressed_in_place = compressed_in_place;
    auto ds = Dataset::Open(dc, o);
    if (!ds.ok()) {
      return absl::Status(ds.status().code(), absl::StrCat("dataset '", dc.name, "': ", ds.status().message()));
    }
    r->datasets_[dc.name] = std::shared_ptr<const Dataset>(std::move(*ds));
  }
  return r;
}

std::vector<std::string> DatasetRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, ds] : datasets_) out.push_back(name);
  return out;
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetRegistry::Find(const std::string& name) const {
  auto it = datasets_.find(name);
  if (it == datasets_.end()) {
    // The name as the client sent it, escaped: control bytes (a terminal's escape sequences)
    // must not reach the terminal that prints the error.
    return absl::NotFoundError(absl::StrCat("no dataset '", absl::CHexEscape(name.substr(0, 64)), "' (served: ",
                                            absl::StrJoin(Names(), ", "), ")"));
  }
  return it->second;
}

uint64_t DatasetRegistry::ResidentBytes() const {
  uint64_t total = 0;
  for (const auto& [name, ds] : datasets_) total += ds->resident_bytes();
  return total;
}

void DatasetRegistry::SetRetainedBytes(uint64_t bytes, uint64_t keep_bytes) const {
  uint64_t shared = 0;
  for (const auto& [name, ds] : datasets_) shared += ds->config().keep_data_in_memory ? 0 : 1;
  for (const auto& [name, ds] : datasets_) {
    ds->SetRetainedBytes(ds->config().keep_data_in_memory ? keep_bytes : bytes / shared);
  }
}

uint64_t DatasetRegistry::DropUnheld(uint64_t bytes) const {
  uint64_t freed = 0;
  for (const bool keep : {false, true}) {
    for (const auto& [name, ds] : datasets_) {
      if (freed >= bytes) return freed;
      if (ds->config().keep_data_in_memory == keep) freed += ds->DropUnheld(bytes - freed);
    }
  }
  return freed;
}

void DatasetRegistry::DropRetainedForReaders() const {
  for (const auto& [name, ds] : datasets_) {
    if (!ds->config().keep_data_in_memory) ds->DropRetained(~uint64_t{0});
  }
}

}  // namespace conveyor
