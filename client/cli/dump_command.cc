// conveyor dump: decode a dataset and print it in the dump format (DESIGN.md section 4).
#include <cstdio>
#include <optional>
#include <string>

#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "common/batch/dump_writer.h"
#include "common/sampling/loader.h"
#include "cuda/cuda_backend.h"

namespace conveyor::cli {
namespace {

struct DumpArgs {
  std::string config;
  std::string dataset;
  std::string randomize;
  uint64_t minibatch_size = 256;
  uint64_t epochs = 1;
  uint64_t epoch_size = 0;
  int threads = 1;
};

int RunDump(const DumpArgs& args) {
  auto config = LoadConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto dc = ChooseDataset(*config, args.dataset);
  if (!dc.ok()) return Fail(dc.status());
  std::optional<bool> randomize;
  if (!args.randomize.empty()) {
    auto r = ParseOnOff("--randomize", args.randomize);
    if (!r.ok()) return Fail(r.status());
    randomize = *r;
  }
  if (auto st = RequireFileOrder(*dc, randomize); !st.ok()) return Fail(st);
  auto ds = OpenWithProgress(*dc, args.threads);
  if (!ds.ok()) return Fail(ds.status());
  auto assembler = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = args.minibatch_size;
  lo.planner.epochs = args.epochs;
  if (args.epoch_size > 0) lo.planner.epoch_size = args.epoch_size;
  else lo.planner.epoch_size = dc->epoch_size;
  lo.threads = args.threads;
  auto loader = Loader::Create(ds->get(), assembler.get(), lo);
  if (!loader.ok()) return Fail(loader.status());
  Batch batch;
  std::string out;
  while (true) {
    auto more = (*loader)->Next(&batch);
    if (!more.ok()) {
      std::fflush(stdout);
      return Fail(more.status());
    }
    if (!*more) break;
    out.clear();
    AppendDump(batch.epoch, batch.index, batch.plan, batch.bytes, &out);
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  (*ds)->diagnostics().Flush();
  if ((*ds)->errors() > 0) {
    std::fprintf(stderr, "conveyor: %llu input errors skipped (maxErrors=%llu)\n",
                 static_cast<unsigned long long>((*ds)->errors()),
                 static_cast<unsigned long long>((*ds)->max_errors()));
  }
  return 0;
}

}  // namespace

void RegisterDump(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DumpArgs>();
  CLI::App* cmd = app.add_subcommand(
      "dump",
      "Decode a dataset through the real read path (index, parser, minibatch packing, batch "
      "assembly) and print every sequence as one JSON line:\n"
      "  {\"epoch\":0,\"batch\":0,\"key\":\"100\",\"streams\":{\"a\":{\"dense\":[[1,2,3]]},"
      "\"b\":{\"sparse\":[[[100,3]]]}}}\n"
      "Minibatches take whole sequences while they hold at most --minibatch-size samples.");
  cmd->add_option("config", args->config, "Configuration file (YAML, JSON or a CNTK reader block)")->required();
  cmd->add_option("--dataset", args->dataset, "Dataset to dump (may be left out when there is only one)");
  cmd->add_option("--randomize", args->randomize,
                  "on|off; default: the dataset's randomize. This build reads in file order (off)");
  cmd->add_option("--minibatch-size", args->minibatch_size, "Samples per minibatch (default 256)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  cmd->add_option("--epochs", args->epochs, "Epochs to read (default 1)")->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32));
  cmd->add_option("--epoch-size", args->epoch_size, "Samples per epoch (default: the dataset's epochSize, else one sweep)");
  cmd->add_option("--threads", args->threads, "Parser threads (default 1; output is the same for any value)")
      ->check(CLI::Range(1, 256));
  cmd->callback([args, exit_code] { *exit_code = RunDump(*args); });
}

}  // namespace conveyor::cli
