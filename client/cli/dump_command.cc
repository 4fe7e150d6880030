// conveyor dump: decode a dataset and print it in the dump format (docs/design.md section 5).
#include <cstdio>
#include <optional>
#include <string>

#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "common/batch/dump_writer.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"

namespace conveyor::cli {
namespace {

struct DumpArgs {
  std::string config;
  std::string dataset;
  StreamArgs stream;
};

int RunDump(const DumpArgs& args) {
  if (auto request = args.stream.ToRequest(); !request.ok()) return FailUsage("dump", request.status());
  auto stream = OpenStream(args.config, args.dataset, args.stream);
  if (!stream.ok()) return Fail(stream.status());
  Loader* loader = stream->loader.get();
  const Dataset* ds = stream->dataset.get();
  Batch batch;
  std::string out;
  while (true) {
    auto more = loader->Next(&batch);
    if (!more.ok()) {
      std::fflush(stdout);
      return Fail(more.status());
    }
    if (!*more) break;
    out.clear();
    AppendDump(batch.epoch, batch.index, batch.plan, batch.bytes, stream->resolved.Encode(batch.after), &out);
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  ds->diagnostics().Flush();
  if (ds->errors() > 0) {
    std::fprintf(stderr, "conveyor: %llu input errors skipped (maxErrors=%llu)\n",
                 static_cast<unsigned long long>(ds->errors()),
                 static_cast<unsigned long long>(ds->max_errors()));
  }
  return 0;
}

}  // namespace

void RegisterDump(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<DumpArgs>();
  CLI::App* cmd = app.add_subcommand(
      "dump",
      "Decode a dataset through the real read path (index, randomizer, parser threads, "
      "minibatch packing, batch assembly) and print every sequence as one JSON line, in "
      "delivery order:\n"
      "  {\"epoch\":0,\"batch\":0,\"key\":\"100\",\"streams\":{\"a\":{\"dense\":[[1,2,3]]},"
      "\"b\":{\"sparse\":[[[100,3]]]}}}\n"
      "The last line of every minibatch carries \"cursor\": pass it to --resume to continue "
      "exactly after that minibatch, on any machine.");
  cmd->add_option("config", args->config, "Configuration file (YAML, JSON or a CNTK reader block)")->required();
  cmd->add_option("--dataset", args->dataset, "Dataset to dump (may be left out when there is only one)");
  AddStreamOptions(cmd, &args->stream);
  cmd->callback([args, exit_code] { *exit_code = RunDump(*args); });
}

}  // namespace conveyor::cli
