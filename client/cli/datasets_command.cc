// conveyor datasets ADDR [NAME...]: what a running daemon serves: each dataset's streams
// (name, alias, format, dim), size and randomization defaults, as DescribeDataset answers.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "client/cli/daemon_options.h"
#include "client/cpp/conveyor_client.h"

namespace conveyor::cli {
namespace {

struct DatasetsArgs {
  std::string address;
  std::vector<std::string> names;
  bool json = false;
  DaemonConnectionArgs connection;
};

const char* FormatName(v1::Format f) {
  switch (f) {
    case v1::FORMAT_DENSE:
      return "dense";
    case v1::FORMAT_SPARSE:
      return "sparse";
    case v1::FORMAT_IDS:
      return "ids";
    default:
      return "unknown";
  }
}

std::string Json(const v1::DatasetDescription& d) {
  std::string out = "{\"name\": \"" + JsonEscape(d.name()) + "\", \"deserializers\": [";
  for (int i = 0; i < d.deserializers_size(); ++i) {
    out += (i > 0 ? ", \"" : "\"") + JsonEscape(d.deserializers(i)) + "\"";
  }
  out += "], \"precision\": \"";
  out += d.precision() == v1::PRECISION_DOUBLE ? "double" : "float";
  out += "\", \"chunks\": " + std::to_string(d.chunks()) + ", \"sequences\": " + std::to_string(d.sequences()) +
         ", \"samples\": " + std::to_string(d.samples()) + ", \"randomize\": " + (d.randomize() ? "true" : "false") +
         ", \"randomization_window\": " + std::to_string(d.randomization_window()) +
         ", \"randomization_window_unit\": \"" + (d.randomization_window_in_samples() ? "samples" : "chunks") +
         "\", \"frame_mode\": " + (d.frame_mode() ? "true" : "false") + ", \"streams\": [";
  for (int i = 0; i < d.streams_size(); ++i) {
    const v1::StreamInfo& s = d.streams(i);
    out += (i > 0 ? ", " : "");
    out += "{\"name\": \"" + JsonEscape(s.name()) + "\", \"alias\": \"" + JsonEscape(s.alias()) + "\", \"format\": \"" +
           FormatName(s.format()) + "\", \"dim\": " + std::to_string(s.dim()) +
           ", \"defines_minibatch_size\": " + (s.defines_minibatch_size() ? "true" : "false") + "}";
  }
  return out + "]}";
}

std::string Count(uint64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

void PrintText(const v1::DatasetDescription& d) {
  std::string kinds;
  for (int i = 0; i < d.deserializers_size(); ++i) kinds += (i > 0 ? " + " : "") + d.deserializers(i);
  std::printf("%s: %s, %s; %s, %s a sweep, %s\n", d.name().c_str(), kinds.c_str(),
              d.precision() == v1::PRECISION_DOUBLE ? "double" : "float", Count(d.sequences(), "sequence").c_str(),
              Count(d.samples(), "sample").c_str(), Count(d.chunks(), "chunk").c_str());
  if (d.randomize()) {
    std::printf("  randomized by default, window %llu %s; %s mode\n",
                static_cast<unsigned long long>(d.randomization_window()),
                d.randomization_window_in_samples() ? "samples" : "chunks", d.frame_mode() ? "frame" : "sequence");
  } else {
    std::printf("  file order by default; %s mode\n", d.frame_mode() ? "frame" : "sequence");
  }
  size_t name_w = 6, alias_w = 5;
  for (const v1::StreamInfo& s : d.streams()) {
    name_w = std::max(name_w, s.name().size());
    alias_w = std::max(alias_w, s.alias().size());
  }
  std::printf("  %-*s  %-*s  %-6s  %10s\n", static_cast<int>(name_w), "stream", static_cast<int>(alias_w), "alias",
              "format", "dim");
  for (const v1::StreamInfo& s : d.streams()) {
    std::printf("  %-*s  %-*s  %-6s  %10llu%s\n", static_cast<int>(name_w), s.name().c_str(),
                static_cast<int>(alias_w), s.alias().c_str(), FormatName(s.format()),
                static_cast<unsigned long long>(s.dim()),
                s.defines_minibatch_size() ? "  (counts toward the minibatch size)" : "");
  }
}

int RunDatasets(const DatasetsArgs& args) {
  auto options = MakeClientOptions(args.connection);
  if (!options.ok()) return Fail(options.status());
  auto client = Client::Connect(DaemonTarget(args.address), *options);
  if (!client.ok()) return Fail(client.status());
  std::vector<std::string> names = args.names;
  if (names.empty()) {
    auto listed = (*client)->ListDatasets();
    if (!listed.ok()) return Fail(ExplainDaemonError(args.address, listed.status(), args.connection));
    names = *listed;
    if (!args.json) {
      std::printf("%s serves %zu dataset%s\n", args.address.c_str(), names.size(), names.size() == 1 ? "" : "s");
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    auto d = (*client)->Describe(names[i]);
    if (!d.ok()) {
      std::fflush(stdout);
      return Fail(ExplainDaemonError(args.address, d.status(), args.connection));
    }
    if (args.json) {
      std::printf("%s\n", Json(*d).c_str());
    } else {
      if (i > 0 || args.names.empty()) std::printf("\n");
      PrintText(*d);
    }
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    return Fail(absl::UnavailableError("cannot write the description to stdout"));
  }
  return 0;
}

}  // namespace

void RegisterDatasets(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DatasetsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "datasets",
      "List what a running conveyord serves: each dataset's streams (name, the file's alias, format, dim), its "
      "sequences, samples and chunks, and the randomization a subscription gets by default. With names, only "
      "those (exit status 1 naming the first the daemon does not serve).\n"
      "Examples:\n"
      "  conveyor datasets unix:/run/conveyor/conveyord.sock\n"
      "  conveyor datasets 10.0.0.5:7070 train --token-file token --json");
  cmd->add_option("address", args->address,
                  "Daemon address: host:port, unix:/path, a socket's path, or replicas separated by commas (the "
                  "first that answers)")
      ->required()
      ->check(DaemonAddress(/*allow_path=*/true));
  cmd->add_option("names", args->names, "Datasets to describe (default: every one)");
  cmd->add_flag("--json", args->json,
                "One JSON object a dataset: {\"name\", \"deserializers\", \"precision\", \"chunks\", \"sequences\", "
                "\"samples\", \"randomize\", \"randomization_window\", \"randomization_window_unit\", \"frame_mode\", "
                "\"streams\": [{\"name\", \"alias\", \"format\", \"dim\", \"defines_minibatch_size\"}]}");
  AddDaemonConnectionOptions(cmd, &args->connection);
  cmd->callback([args, exit_code] {
    if (absl::Status usage = CheckDaemonConnectionArgs(args->connection); !usage.ok()) {
      *exit_code = FailUsage("datasets", usage);
      return;
    }
    *exit_code = RunDatasets(*args);
  });
}

}  // namespace conveyor::cli
