// conveyord: the conveyor daemon. See `conveyord --help`.
//
// Startup runs in two halves. The slow half (loading the configuration, checking the
// addresses, indexing the datasets) runs on a thread of its own while the main thread waits
// for signals, so SIGTERM stops a daemon that is still indexing (or blocked on a FIFO) at
// once. The fast half (sockets, gRPC server) runs on the main thread, which then waits for
// SIGTERM/SIGINT to drain.
#include <grpc/support/log.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cli/command_line.h"
#include "common/config/config_loader.h"
#include "common/malloc_tuning.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "cuda/cuda_backend.h"
#include "server/health_service.h"
#include "server/listen_checks.h"
#include "server/loader_service.h"
#include "server/memory_budget.h"
#include "server/server_builder.h"

namespace {

using conveyor::cli::kExitFailure;

std::string DefaultUnixSocket() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && *runtime) return absl::StrCat(runtime, "/conveyord.sock");
  return absl::StrCat("/tmp/conveyord-", ::getuid(), ".sock");
}

// The bundled examples: $CONVEYOR_EXAMPLES, else beside an installed binary
// (PREFIX/share/conveyor/examples), else the source tree this binary was built from.
std::string ExamplesConfig() {
  if (const char* dir = std::getenv("CONVEYOR_EXAMPLES")) return absl::StrCat(dir, "/conveyor.yaml");
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    const std::string installed = dir + "/../share/conveyor/examples/conveyor.yaml";
    struct stat st;
    if (::stat(installed.c_str(), &st) == 0) return installed;
  }
  return CONVEYOR_EXAMPLES_DIR "/conveyor.yaml";
}

struct Flags {
  std::string config_path, listen, unix_path, port_file, metrics_address, tls_cert, tls_key, token_file;
  std::string assembler, unix_mode;
  bool no_unix = false, insecure = false;
  int parser_threads = 0, parser_threads_per_stream = 0, device = -1, index_threads = 0;
  size_t max_subscriptions = 0;
  uint64_t inline_part_bytes = 0;
  double subscribe_timeout = 10;
};

void AddFlags(CLI::App& app, Flags* f) {
  app.add_option("config", f->config_path,
                 "Configuration file (YAML, JSON or a CNTK reader block); without it, the bundled examples");
  app.add_option("--listen", f->listen,
                 "TCP address host:port (default: the config's listen, else 127.0.0.1:7070; port 0 picks one). "
                 "An address other than loopback needs a token (--token-file) or --insecure");
  app.add_option("--unix", f->unix_path, "Unix socket path (default $XDG_RUNTIME_DIR/conveyord.sock or /tmp/conveyord-UID.sock)");
  app.add_option("--unix-mode", f->unix_mode,
                 "Permissions of the unix socket, in octal: 0600 (default: this user) or 0660 (and its group; "
                 "the config's server.unixSocketMode)");
  app.add_flag("--no-unix", f->no_unix, "Do not listen on a unix socket")->excludes("--unix")->excludes("--unix-mode");
  app.add_option("--port-file", f->port_file, "Write the TCP port chosen to this file once listening");
  app.add_option("--parser-threads", f->parser_threads,
                 "Parser threads shared by all subscriptions: bounds the daemon's parsing CPU (default: the "
                 "config's server.parserThreads, else all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--assembler", f->assembler,
                 "Who assembles batches: cpu (default; or the config's server.assembler) or cuda (GPU kernels, "
                 "bit-identical batches; without a usable device the CPU serves and the startup line says why). "
                 "TRANSPORT_CUDA_IPC subscriptions always assemble on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--device", f->device,
                 "CUDA device for --assembler cuda and the default for CUDA IPC subscriptions (default: the "
                 "config's server.cudaDevice, else 0)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--parser-threads-per-stream", f->parser_threads_per_stream,
                 "Chunks one subscription may parse at once (default: server.parserThreadsPerStream, else 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--max-subscriptions", f->max_subscriptions,
                 "Concurrent Stream calls allowed (default: server.maxSubscriptions, else 256)")
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  app.add_option("--subscribe-timeout", f->subscribe_timeout,
                 "Seconds a Stream call has to send its subscribe message before it is ended with "
                 "DEADLINE_EXCEEDED (default 10): silent calls cannot hold the subscription slots")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--inline-part-bytes", f->inline_part_bytes, "Bytes of a batch per message (default 1 MiB)")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{64} << 20));
  app.add_option("--tls-cert", f->tls_cert, "PEM certificate chain for TLS on TCP (default: the config's tls.cert)");
  app.add_option("--tls-key", f->tls_key, "PEM private key for TLS on TCP (default: the config's tls.key)");
  app.add_option("--token-file", f->token_file,
                 "File holding the bearer token TCP clients must send (default: the config's tokenFile); "
                 "the unix socket is guarded by its permissions instead");
  app.add_flag("--insecure", f->insecure,
               "Allow TCP on a non-loopback address without a token (config: insecure: true): anyone who reaches "
               "the port can read every dataset");
  app.add_option("--metrics", f->metrics_address, "Serve Prometheus metrics at http://ADDR/metrics (host:port)");
  app.add_option("--index-threads", f->index_threads, "Threads for indexing at startup (default: all cores)")
      ->check(CLI::Range(0, 1024));
}

// Removes the reflection plugin from a server.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

// What the slow half of startup produces for the fast half.
struct Prepared {
  std::unique_ptr<conveyor::DatasetRegistry> registry;
  conveyor::ServiceOptions options;
  std::string note;  // which assembler serves, and why
  std::string listen, unix_path, metrics_address, port_file;
  unsigned unix_mode = 0600;
  bool no_unix = false;
  std::string tls_cert_pem, tls_key_pem;
  bool tls = false;
};

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  auto contents = conveyor::ReadFileToString(path);
  if (!contents.ok()) return absl::FailedPreconditionError(absl::StrCat("cannot read the ", what, ": ", contents.status().message()));
  return *contents;
}

absl::StatusOr<unsigned> ParseUnixMode(const std::string& text) {
  unsigned mode = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '7';
    if (ok) mode = mode * 8 + static_cast<unsigned>(c - '0');
  }
  if (!ok || (mode & ~0660u) != 0 || (mode & 0600u) != 0600u) {
    return absl::InvalidArgumentError(absl::StrCat("--unix-mode ", text, ": expected 0600 or 0660 (the owner reads "
                                                   "and writes; the group may; others never)"));
  }
  return mode;
}

// Flags override the config's server block, which overrides the defaults.
void ApplyServiceFlags(const conveyor::Config& config, Flags* f, conveyor::ServiceOptions* options) {
  if (f->parser_threads == 0) f->parser_threads = config.server.parser_threads;
  if (f->parser_threads > 0) options->parser_threads = f->parser_threads;
  if (f->parser_threads_per_stream == 0) f->parser_threads_per_stream = config.server.parser_threads_per_stream;
  if (f->parser_threads_per_stream > 0) options->parser_threads_per_stream = f->parser_threads_per_stream;
  if (f->max_subscriptions == 0) f->max_subscriptions = config.server.max_subscriptions;
  if (f->max_subscriptions > 0) options->max_subscriptions = f->max_subscriptions;
  options->subscribe_timeout_ms = static_cast<int>(f->subscribe_timeout * 1000 + 0.5);
  if (f->inline_part_bytes > 0) options->inline_part_bytes = f->inline_part_bytes;
  if (config.server.staging_bytes > 0) options->staging_bytes = config.server.staging_bytes;
  if (config.server.min_slot_bytes > 0) options->min_slot_bytes = config.server.min_slot_bytes;
  if (config.server.slot_headroom > 0) options->slot_headroom = config.server.slot_headroom;
  conveyor::ApplyMemoryBudgets(config.server, options);
}

// The TCP address and the unix socket's path and mode.
absl::Status ResolveAddresses(const Flags& f, const conveyor::Config& config, Prepared* p) {
  p->listen = !f.listen.empty() ? f.listen : (config.listen.empty() ? "127.0.0.1:7070" : config.listen);
  p->no_unix = f.no_unix;
  p->unix_path = f.unix_path.empty() ? DefaultUnixSocket() : f.unix_path;
  if (!f.unix_mode.empty()) {
    ASSIGN_OR_RETURN(p->unix_mode, ParseUnixMode(f.unix_mode));
  } else if (config.server.unix_socket_mode >= 0) {
    p->unix_mode = static_cast<unsigned>(config.server.unix_socket_mode);
  }
  return absl::OkStatus();
}

// The bearer token, if any; then whether p->listen may be served with it (or without).
absl::Status ResolveToken(const Flags& f, const conveyor::Config& config, Prepared* p) {
  conveyor::ServiceOptions& options = p->options;
  const std::string token_file = !f.token_file.empty() ? f.token_file : config.token_file;
  if (!token_file.empty()) {
    ASSIGN_OR_RETURN(options.token, ReadSecretFile(token_file, "token file"));
    while (!options.token.empty() && std::isspace(static_cast<unsigned char>(options.token.back()))) options.token.pop_back();
    if (options.token.empty()) return absl::FailedPreconditionError(absl::StrCat("the token file ", token_file, " is empty"));
  }
  RETURN_IF_ERROR(conveyor::CheckTcpAddressFree(p->listen));  // also: is it an address at all
  const bool insecure = f.insecure || config.insecure;
  if (options.token.empty() && !insecure && !conveyor::IsLoopbackListenAddress(p->listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve ", p->listen, " without a token: anyone who reaches that address could read every dataset. "
        "Give a token (--token-file FILE, or tokenFile: in the config; clients send it as 'authorization: Bearer "
        "TOKEN'), or listen on loopback (--listen 127.0.0.1:PORT), or accept the risk with --insecure (insecure: true)"));
  }
  return absl::OkStatus();
}

// TLS on TCP: both the certificate and the key, or neither.
absl::Status ResolveTls(const Flags& f, const conveyor::Config& config, Prepared* p) {
  const std::string tls_cert = !f.tls_cert.empty() ? f.tls_cert : config.tls_cert;
  const std::string tls_key = !f.tls_key.empty() ? f.tls_key : config.tls_key;
  if (!tls_cert.empty() || !tls_key.empty()) {
    if (tls_cert.empty() || tls_key.empty()) return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
    ASSIGN_OR_RETURN(p->tls_cert_pem, ReadSecretFile(tls_cert, "TLS certificate"));
    ASSIGN_OR_RETURN(p->tls_key_pem, ReadSecretFile(tls_key, "TLS key"));
    p->tls = true;
  } else if (!p->options.token.empty()) {
    std::fprintf(stderr, "WARNING: a bearer token without TLS travels in clear text\n");
  }
  return absl::OkStatus();
}

// Decided once: without a usable device every subscription gets the CPU assembler, and the
// startup line (p->note) says why. Kaldi compressed matrices stay compressed in the chunks
// (the parser threads only locate them) and are decoded straight into the batch: by the
// device with the CUDA assembler, else by the CPU assembler, one pass instead of decode into
// the chunk then copy (bench/RESULTS.md, issue 19); a dataset in frame mode decodes them at
// parse, whose one-row pieces decode faster whole. HTK frames stay in their files too, and the
// device builds their context windows from the frames sent once.
void ChooseAssembler(const conveyor::Config& config, Flags* f, Prepared* p) {
  conveyor::ServiceOptions& options = p->options;
  std::string assembler = f->assembler;
  if (assembler.empty()) assembler = config.server.assembler.empty() ? "cpu" : config.server.assembler;
  if (f->device < 0) f->device = config.server.cuda_device;
  if (f->device >= 0) options.cuda_device = f->device;
  options.cuda_assembler = assembler == "cuda";
  conveyor::SelectAssembler(options.cuda_assembler, options.cuda_device, &p->note);
  if (p->note.rfind("assembler: cuda", 0) != 0) options.cuda_assembler = false;
  if (options.cuda_assembler) p->note += "; Kaldi compressed matrices and HTK frames decoded on the device";
}

// The slow half: configuration, address checks, assembler, indexing. Runs on its own thread.
absl::StatusOr<Prepared> Prepare(Flags f) {
  Prepared p;
  if (f.config_path.empty()) f.config_path = ExamplesConfig();
  ASSIGN_OR_RETURN(conveyor::Config config, conveyor::LoadConfigFile(f.config_path));
  for (const auto& w : config.warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  ApplyServiceFlags(config, &f, &p.options);
  // Addresses first: a daemon that cannot serve should say so before indexing for minutes.
  RETURN_IF_ERROR(ResolveAddresses(f, config, &p));
  RETURN_IF_ERROR(ResolveToken(f, config, &p));
  RETURN_IF_ERROR(ResolveTls(f, config, &p));
  if (!p.no_unix) {
    RETURN_IF_ERROR(conveyor::PrepareUnixSocketPath(p.unix_path));
    RETURN_IF_ERROR(conveyor::PrepareUnixSocketPath(p.unix_path + ".fd"));
  }
  p.metrics_address = f.metrics_address;
  p.port_file = f.port_file;
  ChooseAssembler(config, &f, &p);
  ASSIGN_OR_RETURN(p.registry, conveyor::DatasetRegistry::Open(config, f.index_threads, /*compressed_in_place=*/true));
  // What indexing freed (ranges grown and merged, kept for reuse) goes back before serving.
  conveyor::ReleaseFreedMemory();
  return p;
}

// Same-host clients fetch shared-memory segments from <unix socket>.fd. Null after printing
// why when it cannot start.
std::unique_ptr<conveyor::FdServer> StartFdServer(const Prepared& p) {
  auto fds = conveyor::FdServer::Start(p.unix_path + ".fd", p.unix_mode);
  if (!fds.ok()) {
    std::fprintf(stderr, "conveyord: %s\n", std::string(fds.status().message()).c_str());
    return nullptr;
  }
  return std::move(*fds);
}

// Serves `metrics` at `address` (host:port). False after printing why when it cannot.
bool StartMetrics(const std::string& address, conveyor::Metrics* metrics) {
  const int mport = metrics->Serve(address);
  if (mport == 0) {
    std::fprintf(stderr, "conveyord: cannot serve metrics on %s (in use, or not host:port)\n", address.c_str());
    return false;
  }
  std::fprintf(stderr, "conveyord: metrics on http://%s:%d/metrics\n", address.substr(0, address.rfind(':')).c_str(),
               mport);
  return true;
}

// The health service (grpc.health.v1): made once, never destroyed (it outlives the server).
conveyor::HealthService& Health() {
  static auto* health = new conveyor::HealthService();
  return *health;
}

// Builds and starts the gRPC server for `service` on TCP (the port chosen in *port) and the
// unix socket. Null (or *port 0) when it cannot listen.
std::unique_ptr<grpc::Server> StartGrpcServer(const Prepared& p, const conveyor::ServiceOptions& options,
                                              conveyor::LoaderService* service, int* port) {
  std::shared_ptr<grpc::ServerCredentials> tcp_creds = grpc::InsecureServerCredentials();
  if (p.tls) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({p.tls_key_pem, p.tls_cert_pem});
    tcp_creds = grpc::SslServerCredentials(ssl);
  }
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Reflection cannot check the token: it answers only where every call is allowed. (Linking
  // the plugin registers it for every builder; this option takes it out again.)
  if (!options.token.empty()) builder.SetOption(std::make_unique<WithoutReflection>());
  // gRPC binds with SO_REUSEPORT by default: a second daemon would share the port with a
  // live one and take half its connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(p.listen, tcp_creds, port);
  if (!p.no_unix) builder.AddListeningPort("unix:" + p.unix_path, grpc::InsecureServerCredentials());
  conveyor::ConfigureServerBuilder(&builder, options);
  builder.SetMaxReceiveMessageSize(64 << 10);  // requests are small; nothing larger is read
  builder.RegisterService(service);
  builder.RegisterService(&Health());  // ours, not gRPC's: its Watch calls are bounded
  // The socket has its mode from the moment it exists: no window in which others connect.
  const mode_t old_umask = ::umask(0777 & ~static_cast<mode_t>(p.unix_mode));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old_umask);
  return server;
}

// The startup line, then the port file for whoever waits on it.
void AnnounceServing(const Prepared& p, const std::vector<std::string>& names, int port, bool token) {
  const std::string host = p.listen.substr(0, p.listen.rfind(':'));
  std::fprintf(stderr, "conveyord %s: serving %s on %s:%d%s%s; %s\n", CONVEYOR_VERSION, absl::StrJoin(names, ", ").c_str(),
               host.c_str(), port, p.no_unix ? "" : (" and unix:" + p.unix_path).c_str(),
               token ? " (token required on TCP; reflection off)" : "", p.note.c_str());
  if (!p.port_file.empty()) {
    std::ofstream(p.port_file + ".tmp") << port << "\n";
    if (std::rename((p.port_file + ".tmp").c_str(), p.port_file.c_str()) != 0) {
      std::fprintf(stderr, "WARNING: cannot write the port file %s\n", p.port_file.c_str());
    }
  }
}

// The gRPC listener gave up accepting because the process ran out of file descriptors: the
// gRPC of Debian 12 (1.51) never tries again (grpc/grpc#20418), so the daemon would stay up
// with every new connection left waiting. Set by the gRPC log hook, which then wakes the
// main thread (SIGUSR1).
std::atomic<bool> g_accept_failed{false};
pthread_t g_main_thread;

// gRPC's log lines as gRPC prints them, watching for "Failed accept4: Too many open files".
void GrpcLog(gpr_log_func_args* args) {
  const char* file = args->file != nullptr ? args->file : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  const char level = args->severity == GPR_LOG_SEVERITY_ERROR ? 'E' : args->severity == GPR_LOG_SEVERITY_INFO ? 'I' : 'D';
  const char* message = args->message != nullptr ? args->message : "";
  std::fprintf(stderr, "%c grpc %s:%d] %s\n", level, file, args->line, message);
  if (std::strstr(message, "Failed accept") != nullptr && std::strstr(message, "Too many open files") != nullptr &&
      !g_accept_failed.exchange(true)) {
    pthread_kill(g_main_thread, SIGUSR1);
  }
}

// libprotobuf's messages (it prints one for every string field of a request that is not
// UTF-8, which any client can send), at most 10 a minute, then a count of those dropped.
void ProtobufLog(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  static std::mutex mu;
  static std::chrono::steady_clock::time_point window;
  static int printed = 0;
  static uint64_t dropped = 0;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu);
  if (now - window >= std::chrono::minutes(1)) {
    if (dropped > 0) std::fprintf(stderr, "conveyord: %llu more libprotobuf messages dropped\n", static_cast<unsigned long long>(dropped));
    window = now;
    printed = 0;
    dropped = 0;
  }
  if (level < google::protobuf::LOGLEVEL_FATAL && printed >= 10) {
    ++dropped;
    return;
  }
  ++printed;
  const char* file = filename != nullptr ? filename : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  std::fprintf(stderr, "[libprotobuf %s:%d] %s%s\n", file, line, message.c_str(),
               printed == 10 ? " (the next ones this minute are dropped)" : "");
}

// The soft limit on open files raised to the hard one (often 1024 against 524288): every
// connection, subscription and segment holds descriptors. Returns the limit in force.
uint64_t RaiseOpenFileLimit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur;
}

// Serves until SIGTERM or SIGINT (or until the listener stops accepting: *accept_failed),
// then drains the streams and stops the server.
void ServeUntilSignalled(const Prepared& p, const sigset_t& signals, grpc::Server* server,
                         conveyor::LoaderService* service, bool* accept_failed) {
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && (sig == SIGHUP || sig == SIGUSR1)) {
    if (g_accept_failed.load()) break;
    if (sig == SIGHUP) {
      std::fprintf(stderr,
                   "conveyord: SIGHUP: reloading the configuration is not supported; restart the daemon "
                   "instead (subscribers resume from their cursors)\n");
    }
  }
  // Health checks answer NOT_SERVING from now on, so load balancers stop sending new trainers.
  Health().SetServing(false);
  *accept_failed = g_accept_failed.load();
  if (*accept_failed) {
    struct rlimit limit;
    const unsigned long long files = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 0;
    std::fprintf(stderr,
                 "conveyord: the process ran out of file descriptors (limit %llu) and gRPC stopped accepting "
                 "connections for good; draining %zu stream(s) and exiting with status 1 so that the supervisor "
                 "restarts it (raise the limit, e.g. systemd's LimitNOFILE, or lower --max-subscriptions)\n",
                 files, service->active_streams());
  } else {
    std::fprintf(stderr, "conveyord: %s: draining %zu stream(s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 service->active_streams());
  }
  service->Drain();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  if (!p.no_unix) ::unlink(p.unix_path.c_str());
}

// The fast half and the life of the server. Returns the exit status.
int Serve(Prepared p, const sigset_t& signals) {
  conveyor::ServiceOptions options = p.options;
  std::unique_ptr<conveyor::FdServer> fd_server;
  if (!p.no_unix) {
    fd_server = StartFdServer(p);
    if (!fd_server) return kExitFailure;
    options.fd_server = fd_server.get();
  }
  conveyor::Metrics metrics;
  options.metrics = &metrics;
  if (!p.metrics_address.empty() && !StartMetrics(p.metrics_address, &metrics)) return kExitFailure;
  const std::vector<std::string> names = p.registry->Names();
  conveyor::LoaderService service(std::move(p.registry), options);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpcServer(p, options, &service, &port);
  if (!server || port == 0) {
    std::fprintf(stderr, "conveyord: cannot listen on %s%s\n", p.listen.c_str(),
                 p.no_unix ? "" : (" or unix:" + p.unix_path).c_str());
    return kExitFailure;
  }
  if (!p.no_unix) ::chmod(p.unix_path.c_str(), p.unix_mode);
  AnnounceServing(p, names, port, !options.token.empty());
  bool accept_failed = false;
  ServeUntilSignalled(p, signals, server.get(), &service, &accept_failed);
  std::fprintf(stderr, "conveyord: stopped\n");
  return accept_failed ? kExitFailure : 0;
}

constexpr char kAbout[] =
    "conveyord: serves the datasets of a conveyor configuration as streams of minibatches over "
    "gRPC (conveyor.v1.Loader), on TCP and on a unix socket. Without CONFIG it serves the bundled "
    "examples. SIGTERM or SIGINT drains: batches in flight are sent, then every client gets its "
    "last cursor and UNAVAILABLE (while still indexing, it stops at once).\n"
    "Exit status: 0 after a drain, 1 when it cannot start (the message says why) or when it ran out of "
    "file descriptors and stopped accepting connections (drained first, for the supervisor to restart it), "
    "2 a usage error.\n"
    "Examples:\n"
    "  conveyord my.yaml --listen 127.0.0.1:7070\n"
    "  conveyord my.yaml --listen 0.0.0.0:7070 --token-file /etc/conveyor/token --metrics 0.0.0.0:9090";

constexpr char kEnvironment[] =
    "Environment:\n"
    "  CONVEYOR_HUGE_PAGES=0          parsed chunks' memory not advised for transparent huge pages (where\n"
    "                                 compacting memory for them shows as latency spikes)\n"
    "  CONVEYOR_HUGE_BLOCK_CACHE_MB=N freed chunk memory kept for reuse, at most N MiB (default 1/8 of the\n"
    "                                 machine's or the cgroup's memory, at most 4096; outside the budgets)\n"
    "  CONVEYOR_EXAMPLES=DIR          where the bundled examples are (DIR/conveyor.yaml), without CONFIG\n"
    "docs/operations.md has the budgets, probes and the huge pages.";

// Signals are taken by sigwait in main; every thread inherits the block. SIGUSR1 is the
// startup thread saying it is done.
sigset_t BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Runs Prepare on a thread of its own while this one waits for signals: SIGTERM or SIGINT
// before it is done exits at once.
absl::StatusOr<Prepared> PrepareInterruptibly(const Flags& flags, const sigset_t& signals) {
  const pthread_t main_thread = pthread_self();
  absl::StatusOr<Prepared> prepared = absl::UnknownError("startup did not finish");
  std::thread startup([&] {
    try {
      prepared = Prepare(flags);
    } catch (const std::exception& e) {
      prepared = absl::InternalError(absl::StrCat("internal error: ", e.what()));
    }
    pthread_kill(main_thread, SIGUSR1);
  });
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig != SIGUSR1) {
    if (sig == SIGHUP) continue;
    // The startup thread may be blocked (a FIFO, a slow disk): leave without waiting for it.
    std::fprintf(stderr, "conveyord: %s while starting (loading and indexing): stopped\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    std::fflush(stderr);
    std::_Exit(0);
  }
  startup.join();
  return prepared;
}

int Run(int argc, char** argv) {
  CLI::App app{kAbout, "conveyord"};
  app.set_version_flag("--version", std::string("conveyord ") + CONVEYOR_VERSION +
                                        (conveyor::CudaBuilt() ? " (CUDA assembler built in)" : " (built without CUDA)"));
  app.footer(kEnvironment);
  Flags flags;
  AddFlags(app, &flags);
  if (auto done = conveyor::cli::ParseCommandLine(app, argc, argv)) return *done;
  const sigset_t signals = BlockSignals();
  g_main_thread = pthread_self();
  gpr_set_log_function(GrpcLog);
  google::protobuf::SetLogHandler(ProtobufLog);
  RaiseOpenFileLimit();
  absl::StatusOr<Prepared> prepared = PrepareInterruptibly(flags, signals);
  if (!prepared.ok()) {
    std::fprintf(stderr, "conveyord: %s\n", std::string(prepared.status().message()).c_str());
    return kExitFailure;
  }
  return Serve(std::move(*prepared), signals);
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::TuneAllocatorForStreaming();
  // Debian's abseil is built without NDEBUG, so every absl::Mutex lock would also update a
  // lock-order graph (1-2% of a stream's CPU in profiles). The tests keep the detection on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    // Errors are statuses; this is the last guard against a library that throws, so that no
    // input ends the daemon by a signal (and systemd does not restart it in a loop).
    std::fprintf(stderr, "conveyord: internal error: %s\n", e.what());
    return kExitFailure;
  }
}
