// conveyor bench: epochs through parsing and CPU assembly, nothing printed but rates.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "common/huge_pages.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"
#ifdef CONVEYOR_HAVE_SERVICE
#include "client/cli/daemon_options.h"
#include "client/cpp/conveyor_client.h"
#include "proto/subscribe.h"
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace conveyor::cli {
namespace {

struct BenchArgs {
  std::string config;  // a configuration file, or a daemon address
  std::string dataset;
  StreamArgs stream;
  bool json = false;
  std::string transport = "inline";  // from a daemon
  uint32_t credits = 0;
#ifdef CONVEYOR_HAVE_SERVICE
  DaemonConnectionArgs connection;  // from a daemon
#endif
};

// memchr over the file: the physical reference a parse rate is read against.
// Binary formats' reference is `cat FILE >/dev/null`: every input file read() in 128 KiB
// blocks (coreutils' buffer size) from the page cache, best of three passes. Returns a
// negative time when an input is no file (a pipe's output).
double CatSeconds(const std::vector<std::string>& paths) {
  std::vector<char> buffer(128 << 10);
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& path : paths) {
      const int fd = path.empty() ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return -1;
      while (::read(fd, buffer.data(), buffer.size()) > 0) {
      }
      ::close(fd);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The same bytes copied from the mapping through a 1 MiB buffer: cat without the system
// calls (memory bandwidth), the stricter reference, and the one for inputs that are no file.
double CopySeconds(const std::vector<std::string_view>& inputs) {
  std::vector<char> buffer(1 << 20);
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::string_view in : inputs) {
      for (size_t at = 0; at < in.size(); at += buffer.size()) {
        const size_t n = std::min(buffer.size(), in.size() - at);
        std::memcpy(buffer.data(), in.data() + at, n);
      }
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (buffer[0] == 1 && buffer[1] == 2) std::printf("-");  // keeps the copies from being optimized away
  }
  return best;
}

double MemchrScanSeconds(std::string_view bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t lines = 0;
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  while (p < end) {
    const void* q = std::memchr(p, '\n', end - p);
    if (q == nullptr) break;
    ++lines;
    p = static_cast<const char*>(q) + 1;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (lines == UINT64_MAX) std::printf("-");  // keeps the scan from being optimized away
  return s;
}

#ifdef CONVEYOR_HAVE_SERVICE
// From the daemon at gRPC target `target`: the batches a subscription receives, timed.
int RunBenchRemote(const BenchArgs& args, const std::string& target) {
  auto request = args.stream.ToRequest();
  if (!request.ok()) return FailUsage("bench", request.status());
  auto options = MakeClientOptions(args.connection);
  if (!options.ok()) return Fail(options.status());
  auto client = Client::Connect(target, *options);
  if (!client.ok()) return Fail(client.status());
  v1::Subscribe s = MakeSubscribe(args.dataset, *request);
  s.set_initial_credits(args.credits);
  if (args.transport == "shm") s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
  if (args.transport == "cuda") s.set_transport(v1::TRANSPORT_CUDA_IPC);  // batches stay on the daemon's GPU
  auto sub = (*client)->Subscribe(s);
  if (!sub.ok()) return Fail(sub.status());
  ReceivedBatch batch;
  uint64_t samples = 0, batches = 0, bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    auto more = (*sub)->Next(&batch);
    if (!more.ok()) return Fail(ExplainDaemonError(args.config, more.status(), args.connection, batches > 0));
    if (!*more) break;
    samples += batch.plan().num_samples;
    bytes += batch.bytes().size();
    ++batches;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!args.json) {
    std::printf("%s from %s (%s): %llu batches, %llu samples, %.1f MB of batches in %.3f s\n", args.dataset.c_str(),
                args.config.c_str(), args.transport.c_str(), static_cast<unsigned long long>(batches),
                static_cast<unsigned long long>(samples), bytes / 1e6, secs);
    std::printf("  %.1f MB/s (%.2f GB/s) of batches, %.0f batches/s, %.0f samples/s\n", bytes / 1e6 / std::max(secs, 1e-9),
                bytes / 1e9 / std::max(secs, 1e-9), batches / std::max(secs, 1e-9), samples / std::max(secs, 1e-9));
  }
  // Inline parts, and those that came in several gRPC slices (put together by one copy).
  const Subscription::WireStats& wire = (*sub)->wire_stats();
  std::printf("{\"bytes\": %llu, \"seconds\": %.6f, \"samples\": %llu, \"batches\": %llu, "
              "\"inline_parts\": %llu, \"inline_parts_in_pieces\": %llu}\n",
              static_cast<unsigned long long>(bytes), secs, static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(batches), static_cast<unsigned long long>(wire.parts),
              static_cast<unsigned long long>(wire.parts_in_pieces));
  return 0;
}
#endif

// CPU seconds of `clock` (CLOCK_THREAD_CPUTIME_ID: the calling thread; CLOCK_PROCESS_CPUTIME_ID:
// every thread of the process).
double CpuSeconds(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int RunBench(const BenchArgs& args) {
  if (auto request = args.stream.ToRequest(); !request.ok()) return FailUsage("bench", request.status());
#ifdef CONVEYOR_HAVE_SERVICE
  // A daemon: an address that is no file here, or a unix socket's path, relative ones too
  // ("d.sock" from its directory), not a configuration.
  struct stat st;
  const bool exists = ::stat(args.config.c_str(), &st) == 0;
  const bool socket = exists && S_ISSOCK(st.st_mode);
  if (socket || (!exists && (args.config.rfind("unix:", 0) == 0 || args.config.find(':') != std::string::npos))) {
    if (absl::Status usage = CheckDaemonConnectionArgs(args.connection); !usage.ok()) return FailUsage("bench", usage);
    return RunBenchRemote(args, socket ? "unix:" + args.config : DaemonTarget(args.config));
  }
  const auto ends_with = [&](std::string_view tail) {
    return args.config.size() >= tail.size() && args.config.compare(args.config.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (!exists && (ends_with(".sock") || ends_with(".socket"))) {
    // Named as a socket, but no file there: a daemon that is not running (or listens
    // elsewhere), not a configuration to look for.
    return Fail(absl::NotFoundError(absl::StrCat(
        args.config, ": no such socket: a daemon's socket exists while conveyord listens on it; is it running, with "
        "--listen unix:", args.config, "? (conveyor health unix:", args.config, " asks it)")));
  }
  if (args.connection.any()) {
    return FailUsage("bench", absl::InvalidArgumentError(
                                  "--tls-ca, --tls-server-name and --token-file apply to a daemon's address, not to a "
                                  "configuration read here"));
  }
#endif
  const auto t_open = std::chrono::steady_clock::now();
  auto stream = OpenStream(args.config, args.dataset, args.stream);
  if (!stream.ok()) return Fail(stream.status());
  Loader* loader = stream->loader.get();
  const Dataset* ds = stream->dataset.get();
  uint64_t samples = 0, batches = 0, batch_bytes = 0, first_samples = 0;
  double first_batch = -1;
  const auto t0 = std::chrono::steady_clock::now();
  // The loader runs on this thread (planning, and assembly where no helper takes it): when its
  // CPU is about the run's wall time, it is what binds, not the parser threads.
  const double thread_cpu0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID), process_cpu0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  auto t_first = t0;
  // Two batches in flight when parser threads help assemble: batch k+1 is planned while
  // they assemble batch k.
  absl::Status read = RunWithOwnBuffers(loader, [&](const Batch& batch) {
    if (first_batch < 0) {
      t_first = std::chrono::steady_clock::now();
      first_batch = std::chrono::duration<double>(t_first - t_open).count();
      first_samples = batch.plan.num_samples;
    }
    samples += batch.plan.num_samples;
    batch_bytes += batch.plan.total_bytes;
    ++batches;
    return absl::OkStatus();
  });
  if (!read.ok()) return Fail(read);
  const auto t_end = std::chrono::steady_clock::now();
  const double loader_cpu = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - thread_cpu0;
  const double process_cpu = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process_cpu0;
  const double secs = std::chrono::duration<double>(t_end - t0).count();
  // Input bytes: the files once a sweep. Where the run reads other than whole sweeps (an
  // epoch size, one rank of several, every k-th batch), the files' share that its samples are.
  const StreamArgs& sa = args.stream;
  const bool whole_sweeps = !sa.epoch_size && sa.world.value_or(1) <= 1 && sa.batch_stride <= 1;
  const uint64_t total = ds->index().total_samples;
  const uint64_t bytes =
      whole_sweeps || total == 0
          ? ds->file_bytes() * sa.epochs
          : static_cast<uint64_t>(static_cast<double>(ds->file_bytes()) * static_cast<double>(samples) / total + 0.5);
  // The rate once the first batch is out: the input of the batches after it (their share of
  // the samples) over the time after it. Without the start (the index, the first chunks'
  // new memory, which on some virtual machines costs more than the parse: bench/RESULTS.md),
  // it is what a long run streams at; 0 with a single batch.
  const double steady_secs = std::chrono::duration<double>(t_end - t_first).count();
  const double steady_mbs = batches > 1 && samples > first_samples && steady_secs > 0
                                ? bytes * (static_cast<double>(samples - first_samples) / samples) / 1e6 / steady_secs
                                : 0;
  if (!args.json) {
    const bool text = ds->config().deserializers[0].type == "CNTKTextFormat";
    const double mbs = bytes / 1e6 / std::max(secs, 1e-9);
    std::printf("%s: %llu batches, %llu samples, %.1f MB of input in %.3f s on %d thread(s), the loader's included\n",
                stream->name.c_str(), static_cast<unsigned long long>(batches),
                static_cast<unsigned long long>(samples), bytes / 1e6, secs, stream->request.threads);
    if (first_batch >= 0) {
      std::printf("  %.1f MB/s input, %.0f samples/s, %.1f MB/s of assembled batches; first batch after %.1f ms\n",
                  mbs, samples / std::max(secs, 1e-9), batch_bytes / 1e6 / std::max(secs, 1e-9), first_batch * 1e3);
    } else {
      std::printf("  no batch: nothing to read\n");
    }
    if (steady_mbs > 0) std::printf("  after the first batch: %.1f MB/s input\n", steady_mbs);
    std::printf("  CPU: %.3f s in all (%.2f cores), %.3f s of it the loader's thread (busy %.0f%% of the run)\n",
                process_cpu, process_cpu / std::max(secs, 1e-9), loader_cpu, 100 * loader_cpu / std::max(secs, 1e-9));
    auto reference = [&](const char* what, double seconds) {
      const double ref_mbs = ds->file_bytes() / 1e6 / std::max(seconds, 1e-9);
      char after[64] = "";
      if (steady_mbs > 0) std::snprintf(after, sizeof(after), " (%.3f after the first batch)", steady_mbs / ref_mbs);
      std::printf("  reference: %s %.0f MB/s; ratio %.3f%s\n", what, ref_mbs, mbs / ref_mbs, after);
    };
    if (text) {
      reference("memchr newline scan of the same file", MemchrScanSeconds(ds->bytes()));
    } else {
      const double cat = CatSeconds(ds->input_paths());
      if (cat > 0) reference("cat FILE >/dev/null (read() in 128 KiB blocks) of the same files", cat);
      reference("memcpy of the same bytes from the mapping (1 MiB buffer)", CopySeconds(ds->inputs()));
    }
  }
  // The large arrays' blocks (huge_pages.h): new memory is what a first epoch pays for on
  // virtual machines, where each fresh page is costly; later epochs reuse the blocks.
  const HugeBlockStats blocks = GetHugeBlockStats();
  if (!args.json) {
    std::printf("  memory for parsed chunks: %llu blocks mapped new, %llu reused; %.1f MB mapped at the end\n",
                static_cast<unsigned long long>(blocks.maps), static_cast<unsigned long long>(blocks.reuses),
                blocks.mapped / 1e6);
  }
  std::printf("{\"bytes\": %llu, \"seconds\": %.6f, \"samples\": %llu, \"batches\": %llu, \"blocks_mapped_new\": %llu, "
              "\"blocks_reused\": %llu, \"blocks_mb\": %.1f, \"first_batch_ms\": %.1f, \"steady_mbs\": %.1f, "
              "\"cpu_seconds\": %.6f, \"loader_cpu_seconds\": %.6f}\n",
              static_cast<unsigned long long>(bytes), secs, static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(batches), static_cast<unsigned long long>(blocks.maps),
              static_cast<unsigned long long>(blocks.reuses), blocks.mapped / 1e6, std::max(first_batch, 0.0) * 1e3,
              steady_mbs, process_cpu, loader_cpu);
  return 0;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Read whole epochs of a dataset through indexing, randomization, parsing and CPU batch "
      "assembly on --threads threads in all without printing batches, and report the rates "
      "next to a reference measured in the same run (a memchr scan of the same file for text; "
      "`cat` and a memcpy of the same bytes for the other formats); or, given a daemon address, the rate a "
      "subscription receives batches at. With --json only the summary line "
      "{\"bytes\": B, \"seconds\": S, \"samples\": N, \"batches\": M, ...} is printed (locally also "
      "blocks_mapped_new, blocks_reused and blocks_mb: the parsed chunks' memory, new and reused; "
      "first_batch_ms: from opening the dataset to the first batch; steady_mbs: MB/s of input after "
      "the first batch, what a long run streams at (0 with one batch); cpu_seconds: the process's CPU "
      "time over the run; loader_cpu_seconds: the loader's thread's (planning, assembly and the parses it does itself; near "
      "seconds when it binds); "
      "from a daemon, inline_parts and inline_parts_in_pieces).");
  cmd->add_option("config", args->config,
                  "Configuration file (YAML, JSON or a CNTK reader block), or a daemon address "
                  "(host:port, unix:/path or a socket's path) to measure streaming from it")->required();
  cmd->add_option("--dataset", args->dataset, "Dataset to read (may be left out when there is only one)");
  AddStreamOptions(cmd, &args->stream);
  cmd->add_flag("--json", args->json, "Print only the JSON summary line");
  cmd->add_option("--transport", args->transport,
                  "From a daemon: inline (default), shm (same host) or cuda (same host, batches assembled on "
                  "the daemon's GPU and opened here with CUDA IPC; bytes counted, not read)")
      ->check(CLI::IsMember({"inline", "shm", "cuda"}));
  cmd->add_option("--credits", args->credits, "From a daemon: batches in flight (default 4, at most 64)")
      ->check(CLI::Range(0u, 64u));
#ifdef CONVEYOR_HAVE_SERVICE
  AddDaemonConnectionOptions(cmd, &args->connection, "From a daemon: ");
#endif
  cmd->callback([args, exit_code] { *exit_code = RunBench(*args); });
}

}  // namespace conveyor::cli
