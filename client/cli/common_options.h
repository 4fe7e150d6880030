// common_options.h: what the subcommands share: loading the configuration, choosing the
// dataset, opening it with a progress bar, and printing errors as one line on stderr.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/dataset/dataset.h"
#include "common/batch/assembler.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"

#include <CLI/CLI.hpp>

namespace conveyor::cli {

// Prints "conveyor: <message>" on stderr and returns 1 (kExitFailure).
int Fail(const absl::Status& status);

// Checks a daemon address option: each comma-separated part is host:port (a bracketed IPv6
// host too), or a gRPC target with a scheme (unix:, unix-abstract:, dns:, ipv4:, ipv6:), or
// with `allow_path` a socket's path (/...). A host without a port is refused with what to write
// (gRPC would take it as port 443 and retry it for seconds).
// `allow_list`: several addresses separated by commas (replicas).
CLI::Validator DaemonAddress(bool allow_path, bool allow_list = true);
// A command line that cannot mean anything (options that contradict each other, a value
// outside its words): prints "conveyor COMMAND: <message>; see 'conveyor COMMAND --help'" and
// returns 2 (kExitUsage), as a parse error does.
int FailUsage(const std::string& command, const absl::Status& status);

// Loads `path` and prints its warnings.
absl::StatusOr<Config> LoadConfig(const std::string& path);

// The dataset called `name`, or the only one when `name` is empty.
absl::StatusOr<DatasetConfig> ChooseDataset(const Config& config, const std::string& name);

// Opens a dataset, drawing a progress bar for the index pass. `compressed_in_place` and
// `reads_frames`: DatasetOpenOptions' (values left in their files for the assembler).
absl::StatusOr<std::unique_ptr<Dataset>> OpenWithProgress(const DatasetConfig& config, int threads,
                                                          bool compressed_in_place = false, bool reads_frames = false);

// `s` as the body of a JSON string (quotes not included), escaped as dumps escape.
std::string JsonEscape(const std::string& s);

// Parses "on"/"off" (also true/false, yes/no, 1/0).
absl::StatusOr<bool> ParseOnOff(const std::string& flag, const std::string& value);

// The stream options shared by dump, bench (and subscribe): what StreamRequest holds.
struct StreamArgs {
  std::string randomize;  // on|off|"" (the configuration's)
  std::optional<uint64_t> seed;
  uint64_t minibatch_size = 256;
  uint64_t epochs = 1;
  std::optional<uint64_t> epoch_size;
  std::optional<uint32_t> rank, world;
  bool frame_mode = false;
  std::string minibatch_mode;  // partial|full|"" (the configuration's)
  uint32_t truncation = 0, parallel = 0;
  std::string resume;
  int threads = 1;
  std::vector<std::string> layouts;  // NAME=csc|csr|dense
  std::vector<std::string> dtypes;   // NAME=float16|bfloat16
  std::string distribution;          // balanced|chunks|"" (the dataset's)
  std::optional<uint64_t> first_epoch;
  uint32_t batch_stride = 1, batch_offset = 0;
  std::string assembler = "cpu";     // cpu | cuda (falls back to cpu, saying why)
  int device = 0;
  // Errors: InvalidArgument for what the command line alone gets wrong (a usage error).
  absl::StatusOr<StreamRequest> ToRequest() const;
};
// `in_process`: the command reads the dataset itself (dump, bench); otherwise (subscribe)
// --threads, --assembler and --device are accepted but hidden from --help, so that the
// command can refuse them by name.
void AddStreamOptions(CLI::App* cmd, StreamArgs* args, bool in_process = true);

// A dataset opened for reading one stream: what dump and bench run.
struct OpenedStream {
  std::string name;
  StreamRequest request;
  std::unique_ptr<Dataset> dataset;
  ResolvedStream resolved;
  std::unique_ptr<BatchAssembler> assembler;
  std::unique_ptr<Loader> loader;
};
// Loads the configuration, chooses the dataset, opens it (with a progress bar), resolves
// the stream options and creates the loader. Errors are ready for Fail().
absl::StatusOr<OpenedStream> OpenStream(const std::string& config, const std::string& dataset,
                                        const StreamArgs& args);

}  // namespace conveyor::cli
