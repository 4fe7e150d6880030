// conveyor health ADDR: asks a daemon's gRPC health service (grpc.health.v1) whether it
// serves. Exit 0 when SERVING, 1 otherwise: what a container HEALTHCHECK or a script runs.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "client/cli/daemon_options.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace conveyor::cli {
namespace {

struct HealthArgs {
  std::string address;
  double timeout = 3;
  bool quiet = false;
};

const char* StatusName(grpc::health::v1::HealthCheckResponse::ServingStatus s) {
  switch (s) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return "SERVING";
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return "NOT_SERVING (draining or starting)";
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

int RunHealth(const HealthArgs& args) {
  auto channel = grpc::CreateChannel(DaemonTarget(args.address), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(args.timeout * 1000)));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) {
    if (!args.quiet) {
      std::fprintf(stderr, "conveyor: %s does not answer health checks: %s\n", args.address.c_str(),
                   st.error_message().c_str());
    }
    return 1;
  }
  const bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (!args.quiet) std::printf("%s: %s\n", args.address.c_str(), StatusName(resp.status()));
  return serving ? 0 : 1;
}

}  // namespace

void RegisterHealth(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<HealthArgs>();
  CLI::App* cmd = app.add_subcommand(
      "health",
      "Ask a daemon whether it serves (the gRPC health protocol, grpc.health.v1): prints SERVING and "
      "exits 0, or exits 1 when it is draining, starting or unreachable. Plaintext only: point it at "
      "the unix socket or a TCP port without TLS (the health service needs no token).");
  cmd->add_option("address", args->address, "Daemon address: host:port, unix:/path or a socket's path")
      ->required()
      ->check(DaemonAddress(/*allow_path=*/true, /*allow_list=*/false));
  cmd->add_option("--timeout", args->timeout, "Seconds to wait for the answer (default 3)")->check(CLI::Range(0.05, 600.0));
  cmd->add_flag("--quiet", args->quiet, "Print nothing; only the exit status tells");
  cmd->callback([args, exit_code] { *exit_code = RunHealth(*args); });
}

}  // namespace conveyor::cli
