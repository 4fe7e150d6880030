// conveyor index: build each dataset's index (writing the cache when cacheIndex is set).
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/common_options.h"

namespace conveyor::cli {
namespace {

struct IndexArgs {
  std::string config;
  std::string dataset;
  int threads = 0;
  bool json = false;
};

const char* SourceKey(IndexSource s) {
  switch (s) {
    case IndexSource::kBuilt:
      return "built";
    case IndexSource::kCache:
      return "cache";
    case IndexSource::kRebuiltStaleCache:
      return "rebuilt_stale_cache";
    case IndexSource::kRebuiltBadCache:
      return "rebuilt_bad_cache";
  }
  return "?";
}

const char* SourceText(IndexSource s) {
  switch (s) {
    case IndexSource::kBuilt:
      return "built";
    case IndexSource::kCache:
      return "loaded from cache";
    case IndexSource::kRebuiltStaleCache:
      return "rebuilt (the cache was stale)";
    case IndexSource::kRebuiltBadCache:
      return "rebuilt (the cache was corrupt)";
  }
  return "?";
}

int RunIndex(const IndexArgs& args) {
  auto config = LoadConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  std::vector<DatasetConfig> targets = config->datasets;
  if (!args.dataset.empty()) {
    auto d = ChooseDataset(*config, args.dataset);
    if (!d.ok()) return Fail(d.status());
    targets = {*d};
  }
  std::string json = "[";
  for (const DatasetConfig& dc : targets) {
    const auto t0 = std::chrono::steady_clock::now();
    auto ds = OpenWithProgress(dc, args.threads);
    if (!ds.ok()) return Fail(ds.status());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Index& index = (*ds)->index();
    if (args.json) {
      absl::StrAppend(&json, json.size() > 1 ? "," : "", "{\"dataset\":\"", JsonEscape(dc.name), "\",\"file\":\"",
                      JsonEscape((*ds)->path()), "\",\"bytes\":", (*ds)->file_bytes(),
                      ",\"sequences\":", index.sequences.size(), ",\"samples\":", index.total_samples,
                      ",\"chunks\":", index.chunks.size(), ",\"index\":\"", SourceKey((*ds)->index_source()),
                      "\",\"seconds\":", absl::StrFormat("%.6f", secs), ",\"input_errors\":", index.errors.count,
                      ",\"cache\":\"", dc.cache_index ? JsonEscape((*ds)->index_cache_path()) : "", "\"}");
      continue;
    }
    // The time covers opening the dataset: mapping, the scan, the content hash and writing the
    // cache, not the process's start or exit. A rate of file bytes only when the file was
    // scanned: a cached index does not read it.
    const std::string rate = (*ds)->index_source() == IndexSource::kCache
                                 ? ""
                                 : absl::StrFormat(" (%.0f MB/s)", (*ds)->file_bytes() / 1e6 / std::max(secs, 1e-9));
    std::printf("%s: %s: %zu sequences, %llu samples, %zu chunks; index %s in %.3f s%s\n", dc.name.c_str(),
                (*ds)->path().c_str(), index.sequences.size(), static_cast<unsigned long long>(index.total_samples),
                index.chunks.size(), SourceText((*ds)->index_source()), secs, rate.c_str());
    if (dc.cache_index && !(*ds)->index_cache_path().empty()) {
      std::printf("  cache: %s\n", (*ds)->index_cache_path().c_str());
    } else if (dc.cache_index) {
      // Only a dataset of one CTF file keeps a cache; the others rebuild their index at each
      // open (CBF from its chunk table and sequence lengths, HTK and Kaldi from their scp or
      // archive), so say so instead of naming no file.
      std::printf("  cache: none (cacheIndex applies to a dataset of one CNTKTextFormat file; this index is "
                  "rebuilt at each open)\n");
    }
    if (index.errors.count > 0)
      std::printf("  %llu blank rows (input errors)\n", static_cast<unsigned long long>(index.errors.count));
  }
  if (args.json) std::printf("%s]\n", json.c_str());
  return 0;
}

}  // namespace

void RegisterIndex(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<IndexArgs>();
  CLI::App* cmd = app.add_subcommand(
      "index",
      "Build the index of every dataset (sequences, chunks, sample counts) in one parallel pass "
      "over each file, with a progress bar. With cacheIndex: true the index is written "
      "beside the data (<file>.<hash>.cvyidx) and reused while the file's size, mtime and sampled "
      "contents (16 pieces of 4 KiB) and the configuration stay the same.");
  cmd->add_option("config", args->config, "Configuration file (YAML, JSON or a CNTK reader block)")->required();
  cmd->add_option("--dataset", args->dataset, "Only this dataset");
  cmd->add_option("--threads", args->threads, "Indexing threads (default: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", args->json, "Print one JSON array (one object per dataset) instead of text");
  cmd->callback([args, exit_code] { *exit_code = RunIndex(*args); });
}

}  // namespace conveyor::cli
