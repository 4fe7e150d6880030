// dataset_registry.h: the datasets a daemon serves, opened (indexed) once at startup and
// shared by every subscription. Clients name datasets; nothing a client sends is a path.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/dataset/dataset.h"

namespace conveyor {

class DatasetRegistry {
 public:
  // Opens every dataset of `config`. `compressed_in_place`: Kaldi compressed matrices stay
  // compressed in parsed chunks, decoded by the assembler straight into each batch (conveyord
  // sets it with either assembler). Errors: the first dataset that fails to open.
  static absl::StatusOr<std::unique_ptr<DatasetRegistry>> Open(const Config& config, int index_threads,
                                                               bool compressed_in_place = false);

  std::vector<std::string> Names() const;
  // NotFound (listing the served names) for an unknown dataset.
  absl::StatusOr<std::shared_ptr<const Dataset>> Find(const std::string& name) const;
  // Heap bytes of the parsed chunks every dataset holds right now (the daemon's chunk cache).
  uint64_t ResidentBytes() const;
  // Recently used chunks kept after their last reader (Dataset::SetRetainedBytes): `bytes`
  // for all datasets together, shared evenly among those without keepDataInMemory; a
  // dataset with keepDataInMemory may keep up to `keep_bytes` (the chunk cache's budget: all
  // of it, parsed once for every subscription to come).
  void SetRetainedBytes(uint64_t bytes, uint64_t keep_bytes) const;
  // Drops every retained chunk of the datasets without keepDataInMemory (no stream is left
  // to read them); those with it keep theirs for the subscriptions to come.
  void DropRetainedForReaders() const;
  // For a parse that needs room: drops retained chunks no reader holds until `bytes` are
  // freed, those of datasets without keepDataInMemory first; returns the bytes freed.
  uint64_t DropUnheld(uint64_t bytes) const;

 private:
  std::map<std::string, std::shared_ptr<const Dataset>> datasets_;
};

}  // namespace conveyor
