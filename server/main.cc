// conveyord: the conveyor daemon. See `conveyord --help`.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config_loader.h"
#include "common/malloc_tuning.h"
#include "common/mapped_file.h"
#include "cuda/cuda_backend.h"
#include "server/loader_service.h"
#include "server/server_builder.h"

namespace {

std::string DefaultUnixSocket() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && *runtime) return absl::StrCat(runtime, "/conveyord.sock");
  return absl::StrCat("/tmp/conveyord-", ::getuid(), ".sock");
}

std::string ExamplesConfig() {
  if (const char* dir = std::getenv("CONVEYOR_EXAMPLES")) return absl::StrCat(dir, "/conveyor.yaml");
  return CONVEYOR_EXAMPLES_DIR "/conveyor.yaml";
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::TuneAllocatorForStreaming();
  CLI::App app{
      "conveyord: serves the datasets of a conveyor configuration as streams of minibatches over "
      "gRPC (conveyor.v1.Loader), on TCP and on a unix socket. Without CONFIG it serves the bundled "
      "examples. SIGTERM or SIGINT drains: batches in flight are sent, then every client gets its "
      "last cursor and UNAVAILABLE.",
      "conveyord"};
  std::string config_path, listen, unix_path, port_file, metrics_address, tls_cert, tls_key, token_file;
  bool no_unix = false;
  conveyor::ServiceOptions options;
  int index_threads = 0;
  app.add_option("config", config_path, "Configuration file (YAML, JSON or a CNTK reader block)");
  app.add_option("--listen", listen, "TCP address host:port (default: the config's listen, else 127.0.0.1:7070; port 0 picks one)");
  app.add_option("--unix", unix_path, "Unix socket path (default $XDG_RUNTIME_DIR/conveyord.sock or /tmp/conveyord-UID.sock)");
  app.add_flag("--no-unix", no_unix, "Do not listen on a unix socket");
  app.add_option("--port-file", port_file, "Write the TCP port chosen to this file once listening");
  int parser_threads = 0, parser_threads_per_stream = 0;
  size_t max_subscriptions = 0;
  app.add_option("--parser-threads", parser_threads,
                 "Parser threads shared by all subscriptions: bounds the daemon's parsing CPU (default: the "
                 "config's server.parserThreads, else all cores)")
      ->check(CLI::Range(1, 1024));
  std::string assembler;
  app.add_option("--assembler", assembler,
                 "Who assembles batches: cpu (default; or the config's server.assembler) or cuda (GPU kernels, "
                 "bit-identical batches; without a usable device the CPU serves and the startup line says why). "
                 "TRANSPORT_CUDA_IPC subscriptions always assemble on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  int device = -1;
  app.add_option("--device", device,
                 "CUDA device for --assembler cuda and the default for CUDA IPC subscriptions (default: the "
                 "config's server.cudaDevice, else 0)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--parser-threads-per-stream", parser_threads_per_stream,
                 "Chunks one subscription may parse at once (default: server.parserThreadsPerStream, else 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--max-subscriptions", max_subscriptions,
                 "Concurrent Stream calls allowed (default: server.maxSubscriptions, else 256)")
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  app.add_option("--inline-part-bytes", options.inline_part_bytes, "Bytes of a batch per message (default 1 MiB)")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{64} << 20));
  app.add_option("--tls-cert", tls_cert, "PEM certificate chain for TLS on TCP (default: the config's tls.cert)");
  app.add_option("--tls-key", tls_key, "PEM private key for TLS on TCP (default: the config's tls.key)");
  app.add_option("--token-file", token_file,
                 "File holding the bearer token TCP clients must send (default: the config's tokenFile); "
                 "the unix socket is guarded by its 0600 permissions instead");
  app.add_option("--metrics", metrics_address, "Serve Prometheus metrics at http://ADDR/metrics (host:port)");
  app.add_option("--index-threads", index_threads, "Threads for indexing at startup (default: all cores)");
  CLI11_PARSE(app, argc, argv);

  // Signals are taken by sigwait in main; every thread inherits the block.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (config_path.empty()) config_path = ExamplesConfig();
  auto config = conveyor::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "conveyord: %s\n", std::string(config->source.empty() ? config.status().message() : config.status().message()).c_str());
    return 1;
  }
  for (const auto& w : config->warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  // Flags override the config's server block, which overrides the defaults.
  if (parser_threads == 0) parser_threads = config->server.parser_threads;
  if (parser_threads > 0) options.parser_threads = parser_threads;
  if (parser_threads_per_stream == 0) parser_threads_per_stream = config->server.parser_threads_per_stream;
  if (parser_threads_per_stream > 0) options.parser_threads_per_stream = parser_threads_per_stream;
  if (max_subscriptions == 0) max_subscriptions = config->server.max_subscriptions;
  if (max_subscriptions > 0) options.max_subscriptions = max_subscriptions;
  if (config->server.staging_bytes > 0) options.staging_bytes = config->server.staging_bytes;
  if (config->server.min_slot_bytes > 0) options.min_slot_bytes = config->server.min_slot_bytes;
  if (config->server.slot_headroom > 0) options.slot_headroom = config->server.slot_headroom;
  // Decided once: without a usable device every subscription gets the CPU assembler, and the
  // startup line says why. With the CUDA assembler, Kaldi compressed matrices are decoded on
  // the device: the parser threads leave them compressed.
  std::string note;
  if (assembler.empty()) assembler = config->server.assembler.empty() ? "cpu" : config->server.assembler;
  if (device < 0) device = config->server.cuda_device;
  if (device >= 0) options.cuda_device = device;
  options.cuda_assembler = assembler == "cuda";
  conveyor::SelectAssembler(options.cuda_assembler, options.cuda_device, &note);
  if (note.rfind("assembler: cuda", 0) != 0) options.cuda_assembler = false;
  if (options.cuda_assembler) note += "; Kaldi compressed matrices decoded on the device";
  auto registry = conveyor::DatasetRegistry::Open(*config, index_threads, options.cuda_assembler);
  if (!registry.ok()) {
    std::fprintf(stderr, "conveyord: %s\n", std::string(registry.status().message()).c_str());
    return 1;
  }
  const std::vector<std::string> names = (*registry)->Names();
  if (listen.empty()) listen = config->listen.empty() ? "127.0.0.1:7070" : config->listen;
  if (unix_path.empty()) unix_path = DefaultUnixSocket();

  // Same-host clients fetch shared-memory segments from <unix socket>.fd.
  std::unique_ptr<conveyor::FdServer> fd_server;
  if (!no_unix) {
    auto fds = conveyor::FdServer::Start(unix_path + ".fd");
    if (!fds.ok()) {
      std::fprintf(stderr, "conveyord: %s\n", std::string(fds.status().message()).c_str());
      return 1;
    }
    fd_server = std::move(*fds);
    options.fd_server = fd_server.get();
  }
  conveyor::Metrics metrics;
  options.metrics = &metrics;
  if (!metrics_address.empty()) {
    const int mport = metrics.Serve(metrics_address);
    if (mport == 0) {
      std::fprintf(stderr, "conveyord: cannot serve metrics on %s\n", metrics_address.c_str());
      return 1;
    }
    std::fprintf(stderr, "conveyord: metrics on http://%s:%d/metrics\n",
                 metrics_address.substr(0, metrics_address.rfind(':')).c_str(), mport);
  }
  if (tls_cert.empty()) tls_cert = config->tls_cert;
  if (tls_key.empty()) tls_key = config->tls_key;
  if (token_file.empty()) token_file = config->token_file;
  auto read_file = [](const std::string& path, std::string* out) {
    auto contents = conveyor::ReadFileToString(path);
    if (contents.ok()) *out = std::move(*contents);
    return contents.ok();
  };
  std::shared_ptr<grpc::ServerCredentials> tcp_creds = grpc::InsecureServerCredentials();
  if (!tls_cert.empty() || !tls_key.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (!read_file(tls_cert, &pair.cert_chain) || !read_file(tls_key, &pair.private_key)) {
      std::fprintf(stderr, "conveyord: cannot read the TLS certificate %s or key %s\n", tls_cert.c_str(), tls_key.c_str());
      return 1;
    }
    ssl.pem_key_cert_pairs.push_back(pair);
    tcp_creds = grpc::SslServerCredentials(ssl);
  }
  if (!token_file.empty()) {
    if (!read_file(token_file, &options.token)) {
      std::fprintf(stderr, "conveyord: cannot read the token file %s\n", token_file.c_str());
      return 1;
    }
    while (!options.token.empty() && std::isspace(static_cast<unsigned char>(options.token.back()))) options.token.pop_back();
    if (options.token.empty()) {
      std::fprintf(stderr, "conveyord: the token file %s is empty\n", token_file.c_str());
      return 1;
    }
    if (tls_cert.empty()) std::fprintf(stderr, "WARNING: a bearer token without TLS travels in clear text\n");
  }
  conveyor::ApplyMemoryBudgets(config->server, &options);
  conveyor::LoaderService service(std::move(*registry), options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, tcp_creds, &port);
  if (!no_unix) {
    struct stat st;
    if (::lstat(unix_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(unix_path.c_str());  // stale
    builder.AddListeningPort("unix:" + unix_path, grpc::InsecureServerCredentials());
  }
  conveyor::ConfigureServerBuilder(&builder, options);
  builder.SetMaxReceiveMessageSize(64 << 10);  // requests are small; nothing larger is read
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "conveyord: cannot listen on %s%s\n", listen.c_str(),
                 no_unix ? "" : (" or unix:" + unix_path).c_str());
    return 1;
  }
  if (!no_unix) ::chmod(unix_path.c_str(), 0600);  // same-host clients of this user only
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::fprintf(stderr, "conveyord: serving %s on %s:%d%s; %s\n", absl::StrJoin(names, ", ").c_str(), host.c_str(), port,
               no_unix ? "" : (" and unix:" + unix_path).c_str(), note.c_str());
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << port << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    std::fprintf(stderr,
                 "conveyord: SIGHUP: reloading the configuration is not supported; restart the daemon "
                 "instead (subscribers resume from their cursors)\n");
  }
  // Health checks answer NOT_SERVING from now on, so load balancers stop sending new trainers.
  if (auto* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  std::fprintf(stderr, "conveyord: %s: draining %zu stream(s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               service.active_streams());
  service.Drain();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  if (!no_unix) ::unlink(unix_path.c_str());
  std::fprintf(stderr, "conveyord: stopped\n");
  return 0;
}
