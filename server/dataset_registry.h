// dataset_registry.h: the datasets a daemon serves, opened (indexed) once at startup and
// shared by every subscription. Clients name datasets; nothing a client sends is a path.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

  // Opens again (indexes again) every dataset one of whose files changed since it was opened:
  // another file at its path (a new one renamed over it, the way to replace data), or its
  // size or mtime changed (rewritten in place: its streams fail with DataLoss). New
  // subscriptions get the new dataset; streams already running keep the one they started
  // with. A dataset that cannot be opened again keeps the one it had. What it did, a line
  // for each dataset looked at, goes to `log`. Called on SIGHUP; one call at a time.
  void ReopenChanged(const std::function<void(const std::string&)>& log);

 private:
  // A file a dataset reads, as it was when the dataset was opened (stat(2) right after).
  struct InputStamp {
    std::string path;
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const InputStamp& o) const {
      return path == o.path && dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  struct Entry {
    std::shared_ptr<const Dataset> dataset;
    std::vector<InputStamp> inputs;
  };
  static std::vector<InputStamp> StampInputs(const Dataset& ds);
  absl::StatusOr<Entry> OpenEntry(const DatasetConfig& config) const;

  int index_threads_ = 0;
  bool compressed_in_place_ = false;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> datasets_ ABSL_GUARDED_BY(mu_);
  // SetRetainedBytes' arguments, for a dataset opened again.
  mutable uint64_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0, keep_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex reopen_mu_;  // one ReopenChanged() at a time
};

}  // namespace conveyor
