#include "client/cli/common_options.h"

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/progress.h"
#include "common/config/config_loader.h"

namespace conveyor::cli {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "conveyor: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  auto config = LoadConfigFile(path);
  if (config.ok()) {
    for (const auto& w : config->warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  }
  return config;
}

absl::StatusOr<DatasetConfig> ChooseDataset(const Config& config, const std::string& name) {
  if (name.empty()) {
    if (config.datasets.size() == 1) return config.datasets[0];
    return absl::InvalidArgumentError(absl::StrCat(config.source, " defines several datasets (",
                                                   config.DatasetNames(), "): choose one with --dataset"));
  }
  const DatasetConfig* d = config.Find(name);
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat(config.source, " has no dataset '", name,
                                            "' (it defines: ", config.DatasetNames(), ")"));
  }
  return *d;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenWithProgress(const DatasetConfig& config, int threads) {
  std::string label = "indexing";
  if (!config.deserializers.empty()) {
    const std::string& f = config.deserializers[0].file;
    label = absl::StrCat("indexing ", f.substr(f.rfind('/') == std::string::npos ? 0 : f.rfind('/') + 1));
  }
  ProgressBar bar(label);
  DatasetOpenOptions options;
  options.index_threads = threads;
  options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  auto ds = Dataset::Open(config, options);
  bar.Finish();
  return ds;
}

absl::StatusOr<bool> ParseOnOff(const std::string& flag, const std::string& value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "on" || v == "true" || v == "yes" || v == "1") return true;
  if (v == "off" || v == "false" || v == "no" || v == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(flag, " expects on or off, got '", value, "'"));
}

absl::Status RequireFileOrder(const DatasetConfig& ds, const std::optional<bool>& randomize_flag) {
  const bool randomize = randomize_flag.value_or(ds.randomize);
  if (!randomize) return absl::OkStatus();
  if (randomize_flag) {
    return absl::UnimplementedError(
        "--randomize on: this build reads in file order only; use --randomize off");
  }
  return absl::UnimplementedError(absl::StrCat(
      "dataset '", ds.name, "' randomizes (randomize: true, CNTK's default) but this build reads "
      "in file order only: pass --randomize off, or set randomize: false in the configuration"));
}

}  // namespace conveyor::cli
