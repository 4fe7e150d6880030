// conveyor convert IN OUT.cbf --config CONFIG: writes a dataset as a CNTK binary file (what
// CNTK's ctf2bin.py does; see common/convert/cbf_writer.h for where it differs).
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "client/cli/progress.h"
#include "common/convert/cbf_writer.h"

namespace conveyor::cli {
namespace {

struct ConvertArgs {
  std::string input, output, config, dataset;
  uint64_t chunk_size = 32ull << 20;
  int threads = 0;
};

int RunConvert(const ConvertArgs& args) {
  auto config = LoadConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto dc = ChooseDataset(*config, args.dataset);
  if (!dc.ok()) return Fail(dc.status());
  if (dc->deserializers.size() != 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("dataset '", dc->name, "' has ", dc->deserializers.size(),
                                                        " deserializers; convert reads one file")));
  }
  dc->deserializers[0].file = args.input;  // the configuration describes its streams
  dc->cache_index = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto ds = OpenWithProgress(*dc, args.threads);
  if (!ds.ok()) return Fail(ds.status());
  ProgressBar bar("converting");
  CbfWriteOptions wo;
  wo.chunk_size = args.chunk_size;
  wo.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  auto stats = WriteCbf(**ds, args.output, wo);
  bar.Finish();
  if (!stats.ok()) return Fail(stats.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s -> %s: %llu sequences, %llu samples, %llu chunks, %llu bytes in %.2f s (%.0f MB/s of input)\n",
              args.input.c_str(), args.output.c_str(), static_cast<unsigned long long>(stats->sequences),
              static_cast<unsigned long long>(stats->samples), static_cast<unsigned long long>(stats->chunks),
              static_cast<unsigned long long>(stats->bytes), secs, (*ds)->file_bytes() / 1e6 / std::max(secs, 1e-9));
  return 0;
}

}  // namespace

void RegisterConvert(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Write a dataset as a CNTK binary file (CBF), as CNTK's ctf2bin.py does: IN is read with the "
      "streams a dataset of CONFIG describes (its own file is replaced by IN), OUT gets them in "
      "that order under their input names, in the dataset's precision. Unlike ctf2bin, chunks "
      "keep the requested size and empty sparse samples are kept. Read OUT back with "
      "`type: CNTKBinary`.\nExample:\n  conveyor convert train.ctf train.cbf --config conveyor.yaml "
      "--dataset train");
  cmd->add_option("input", args->input, "The data file to convert (e.g. a CTF file)")->required();
  cmd->add_option("output", args->output, "The CBF file to write (written to OUTPUT.tmp, renamed when complete)")
      ->required();
  cmd->add_option("--config", args->config, "Configuration describing the input's streams")->required();
  cmd->add_option("--dataset", args->dataset, "Dataset of the configuration (may be left out when there is one)");
  cmd->add_option("--chunk-size", args->chunk_size, "Bytes of binary data per chunk (default 33554432)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  cmd->add_option("--threads", args->threads, "Threads for indexing the input (default 0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->callback([args, exit_code] { *exit_code = RunConvert(*args); });
}

}  // namespace conveyor::cli
