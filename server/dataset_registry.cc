#include "server/dataset_registry.h"

#include <sys/stat.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace conveyor {

std::vector<DatasetRegistry::InputStamp> DatasetRegistry::StampInputs(const Dataset& ds) {
  std::vector<InputStamp> out;
  for (const std::string& path : ds.input_paths()) {
    if (path.empty()) continue;  // a pipe's output
    InputStamp s;
    s.path = path;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      s.dev = static_cast<uint64_t>(st.st_dev);
      s.ino = static_cast<uint64_t>(st.st_ino);
      s.size = static_cast<uint64_t>(st.st_size);
      s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    }
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<DatasetRegistry::Entry> DatasetRegistry::OpenEntry(const DatasetConfig& config) const {
  DatasetOpenOptions o;
  o.index_threads = index_threads_;
  o.compressed_in_place = compressed_in_place_;
  auto ds = Dataset::Open(config, o);
  if (!ds.ok()) {
    return absl::Status(ds.status().code(), absl::StrCat("dataset '", config.name, "': ", ds.status().message()));
  }
  Entry e;
  e.inputs = StampInputs(**ds);
  e.dataset = std::shared_ptr<const Dataset>(std::move(*ds));
  return e;
}

absl::StatusOr<std::unique_ptr<DatasetRegistry>> DatasetRegistry::Open(const Config& config, int index_threads,
                                                                       bool compressed_in_place) {
  auto r = std::unique_ptr<DatasetRegistry>(new DatasetRegistry());
  r->index_threads_ = index_threads;
  r->compressed_in_place_ = compressed_in_place;
  for (const DatasetConfig& dc : config.datasets) {
    ASSIGN_OR_RETURN(Entry e, r->OpenEntry(dc));
    absl::MutexLock lock(&r->mu_);
    r->datasets_[dc.name] = std::move(e);
  }
  return r;
}

std::vector<std::string> DatasetRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, e] : datasets_) out.push_back(name);
  return out;
}

absl::StatusOr<std::shared_ptr<const Dataset>> DatasetRegistry::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = datasets_.find(name);
  if (it == datasets_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, e] : datasets_) names.push_back(n);
    return absl::NotFoundError(absl::StrCat("no dataset '", name.substr(0, 64), "' (served: ", absl::StrJoin(names, ", "), ")"));
  }
  return it->second.dataset;
}

uint64_t DatasetRegistry::ResidentBytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [name, e] : datasets_) total += e.dataset->resident_bytes();
  return total;
}

void DatasetRegistry::SetRetainedBytes(uint64_t bytes, uint64_t keep_bytes) const {
  absl::MutexLock lock(&mu_);
  retained_bytes_ = bytes;
  keep_bytes_ = keep_bytes;
  uint64_t shared = 0;
  for (const auto& [name, e] : datasets_) shared += e.dataset->config().keep_data_in_memory ? 0 : 1;
  for (const auto& [name, e] : datasets_) {
    e.dataset->SetRetainedBytes(e.dataset->config().keep_data_in_memory ? keep_bytes : bytes / std::max<uint64_t>(shared, 1));
  }
}

uint64_t DatasetRegistry::DropUnheld(uint64_t bytes) const {
  absl::MutexLock lock(&mu_);
  uint64_t freed = 0;
  for (const bool keep : {false, true}) {
    for (const auto& [name, e] : datasets_) {
      if (freed >= bytes) return freed;
      if (e.dataset->config().keep_data_in_memory == keep) freed += e.dataset->DropUnheld(bytes - freed);
    }
  }
  return freed;
}

void DatasetRegistry::DropRetainedForReaders() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, e] : datasets_) {
    if (!e.dataset->config().keep_data_in_memory) e.dataset->DropRetained(~uint64_t{0});
  }
}

void DatasetRegistry::ReopenChanged(const std::function<void(const std::string&)>& log) {
  absl::MutexLock one_at_a_time(&reopen_mu_);
  std::vector<std::pair<std::string, Entry>> current;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, e] : datasets_) current.emplace_back(name, e);
  }
  for (const auto& [name, old] : current) {
    const std::vector<InputStamp> now = StampInputs(*old.dataset);
    std::string what;
    for (size_t i = 0; i < now.size() && i < old.inputs.size() && what.empty(); ++i) {
      const InputStamp &a = old.inputs[i], &b = now[i];
      if (a == b) continue;
      if (b.ino == 0 && b.dev == 0 && b.size == 0) what = absl::StrCat(a.path, " is gone");
      else if (a.dev != b.dev || a.ino != b.ino) what = absl::StrCat(a.path, " was replaced");
      else what = absl::StrCat(a.path, " changed in place");
    }
    if (what.empty()) {
      log(absl::StrCat("dataset '", name, "': its files are unchanged"));
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto reopened = OpenEntry(old.dataset->config());
    if (!reopened.ok()) {
      log(absl::StrCat("dataset '", name, "': ", what, ", but it cannot be opened again (", reopened.status().message(),
                       "); still serving it as opened"));
      continue;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t sequences = reopened->dataset->index().sequences.size();
    {
      absl::MutexLock lock(&mu_);
      uint64_t shared = 0;
      for (const auto& [n, e] : datasets_) shared += e.dataset->config().keep_data_in_memory ? 0 : 1;
      reopened->dataset->SetRetainedBytes(reopened->dataset->config().keep_data_in_memory
                                              ? keep_bytes_
                                              : retained_bytes_ / std::max<uint64_t>(shared, 1));
      datasets_[name] = *std::move(reopened);
    }
    log(absl::StrFormat("dataset '%s': %s: opened again in %.2f s, %d sequences; new subscriptions read it, "
                        "streams already running keep what they had",
                        name, what, seconds, sequences));
  }
}

}  // namespace conveyor
