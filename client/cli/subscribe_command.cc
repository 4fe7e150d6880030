// conveyor subscribe: a client of conveyord. Streams batches, prints throughput, or with
// --dump the dump format (identical to `conveyor dump` with the same options).
#include <chrono>
#include <cstdio>
#include <string>

#include "client/cli/commands.h"
#include "common/cli/command_line.h"
#include "client/cli/common_options.h"
#include "client/cli/daemon_options.h"
#include "client/cpp/conveyor_client.h"
#include "proto/subscribe.h"
#include "common/batch/dump_writer.h"
#include "cuda/slot_pool.h"

namespace conveyor::cli {
namespace {

struct SubscribeArgs {
  std::string address;
  std::string dataset;
  StreamArgs stream;
  bool dump = false;
  uint32_t credits = 0;
  bool no_reconnect = false;
  double idle_timeout = 60;  // seconds; 0: none
  double keepalive = 3;      // seconds between pings
  std::string transport = "inline";
  DaemonConnectionArgs connection;
};

int RunSubscribe(const SubscribeArgs& args) {
  auto request = args.stream.ToRequest();
  if (!request.ok()) return FailUsage("subscribe", request.status());
  if (args.transport != "inline" && args.transport != "shm" && args.transport != "shared-memory" &&
      args.transport != "cuda") {
    return FailUsage("subscribe", absl::InvalidArgumentError("--transport expects inline, shm or cuda"));
  }
  auto options = MakeClientOptions(args.connection);
  if (!options.ok()) return Fail(options.status());
  ClientOptions co = *options;
  co.keepalive_time_ms = static_cast<int>(args.keepalive * 1000);
  co.keepalive_timeout_ms = co.keepalive_time_ms;
  auto client = Client::Connect(DaemonTarget(args.address), co);
  if (!client.ok()) return Fail(client.status());
  v1::Subscribe s = MakeSubscribe(args.dataset, *request);
  s.set_initial_credits(args.credits);
  if (args.transport == "shm" || args.transport == "shared-memory") s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
  else if (args.transport == "cuda") s.set_transport(v1::TRANSPORT_CUDA_IPC);
  std::vector<std::byte> host;  // --dump of device batches: copied to the host first
  SubscribeOptions so;
  so.reconnect = !args.no_reconnect;
  so.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(args.idle_timeout * 1000));
  auto sub = (*client)->Subscribe(s, so);
  if (!sub.ok()) return Fail(sub.status());
  ReceivedBatch batch;
  std::string out;
  uint64_t batches = 0, samples = 0, bytes = 0, dropped = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto say_dropped = [&dropped] {
    if (dropped == 0) return;
    std::fprintf(stderr,
                 "conveyor: %llu piece%s (whole sequences; frames in frame mode; fragments in truncated BPTT) left out "
                 "of the batches: dropped as bad input under the dataset's maxErrors (the daemon's log names them)\n",
                 static_cast<unsigned long long>(dropped), dropped == 1 ? "" : "s");
  };
  while (true) {
    auto more = (*sub)->Next(&batch);
    if (!more.ok()) {
      std::fflush(stdout);
      say_dropped();
      if (!(*sub)->last_cursor().empty()) {
        std::fprintf(stderr, "conveyor: last cursor received: %s\n", (*sub)->last_cursor().c_str());
      }
      return Fail(ExplainDaemonError(args.address, more.status(), args.connection, batches > 0));
    }
    if (!*more) break;
    ++batches;
    dropped += batch.descriptor().dropped();
    samples += batch.plan().num_samples;
    bytes += batch.bytes().size();
    if (args.dump) {
      out.clear();
      absl::Span<const std::byte> view = batch.bytes();
      if (batch.on_device()) {
        host.resize(view.size());
        absl::Status copied = gpu::CopyMemory(host.data(), view.data(), view.size());
        if (!copied.ok()) return Fail(copied);
        view = absl::MakeConstSpan(host);
      }
      AppendDump(batch.descriptor().epoch(), batch.descriptor().batch(), batch.plan(), view, batch.cursor(), &out);
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  }
  std::fflush(stdout);
  say_dropped();
  if (!args.dump) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s from %s: %llu batches, %llu samples, %.1f MB in %.3f s: %.0f samples/s, %.1f MB/s\n",
                args.dataset.c_str(), args.address.c_str(), static_cast<unsigned long long>(batches),
                static_cast<unsigned long long>(samples), bytes / 1e6, secs, samples / std::max(secs, 1e-9),
                bytes / 1e6 / std::max(secs, 1e-9));
    std::printf("last cursor: %s\n", (*sub)->last_cursor().c_str());
  }
  return 0;
}

}  // namespace

void RegisterSubscribe(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<SubscribeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "subscribe",
      "Stream a dataset's minibatches from a running conveyord (ADDR: host:port or unix:/path) and "
      "print the throughput, or with --dump every sequence in the dump format (the same lines as "
      "`conveyor dump` with the same options). A broken stream is resumed from the last cursor.");
  cmd->add_option("address", args->address,
                  "Daemon address: host:port, unix:/path, a socket's path, dns:///name:port, or replicas separated by commas "
                  "(a stream whose daemon fails resumes on the next)")
      ->required()
      ->check(DaemonAddress(/*allow_path=*/true));
  cmd->add_option("--dataset", args->dataset, "Dataset to stream (as the daemon names it)")->required();
  cmd->add_flag("--dump", args->dump, "Print the batches in the dump format");
  cmd->add_option("--credits", args->credits, "Batches the daemon may send ahead of this client (default 4, at most 64)")
      ->check(CLI::Range(0u, 64u));
  cmd->add_option("--transport", args->transport,
                  "inline (default: bytes in the messages), shm (same host: batches stay in the daemon's "
                  "shared-memory slots, only descriptors travel) or cuda (same host: assembled on the daemon's "
                  "GPU and opened here with CUDA IPC; --dump copies each batch to the host)");
  AddDaemonConnectionOptions(cmd, &args->connection);
  cmd->add_flag("--no-reconnect", args->no_reconnect, "Fail instead of resuming when the stream breaks");
  cmd->add_option("--idle-timeout", args->idle_timeout,
                  "Seconds without a message after which the stream counts as broken (a wedged daemon; "
                  "default 60, 0: never)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--keepalive", args->keepalive,
                  "Seconds between keepalive pings; a daemon that does not answer one within as long again is "
                  "gone (default 3)")
      ->check(CLI::Range(1.0, 3600.0));
  AddStreamOptions(cmd, &args->stream, /*in_process=*/false);
  cmd->callback([cmd, args, exit_code] {
    if (absl::Status usage = CheckDaemonConnectionArgs(args->connection); !usage.ok()) {
      *exit_code = FailUsage("subscribe", usage);
      return;
    }
    // The daemon parses and assembles: options that only steer this process would be ignored.
    for (const char* local : {"--threads", "--assembler", "--device"}) {
      if (cmd->count(local) > 0) {
        std::fprintf(stderr,
                     "conveyor subscribe: %s does not apply to subscribe: the daemon parses and assembles (set "
                     "--parser-threads, --assembler and --device on conveyord); see 'conveyor subscribe --help'\n",
                     local);
        *exit_code = kExitUsage;
        return;
      }
    }
    *exit_code = RunSubscribe(*args);
  });
}

}  // namespace conveyor::cli
