#include "client/cli/daemon_options.h"

#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"

namespace conveyor::cli {

std::string DaemonTarget(const std::string& address) {
  if (!address.empty() && (address[0] == '/' || address.rfind("./", 0) == 0 || address.rfind("../", 0) == 0))
    return "unix:" + address;
  return address;
}

void AddDaemonConnectionOptions(CLI::App* cmd, DaemonConnectionArgs* args) {
  cmd->add_option("--tls-ca", args->tls_ca, "PEM roots to trust: connect with TLS (the daemon's --tls-cert is signed by them)");
  cmd->add_option("--tls-server-name", args->tls_server_name, "Name the daemon's certificate must carry, if not the host's");
  cmd->add_option("--token-file", args->token_file,
                  "File with the bearer token the daemon requires on TCP (its --token-file; not needed on its unix socket)");
}

absl::StatusOr<ClientOptions> MakeClientOptions(const DaemonConnectionArgs& args) {
  ClientOptions co;
  if (!args.tls_ca.empty()) {
    auto roots = ReadFileToString(args.tls_ca);
    if (!roots.ok()) return roots.status();
    co.tls_root_certs = *roots;
  }
  co.tls_server_name = args.tls_server_name;
  if (!args.token_file.empty()) {
    auto token = ReadFileToString(args.token_file);
    if (!token.ok()) return token.status();
    co.token = *token;
    while (!co.token.empty() && std::isspace(static_cast<unsigned char>(co.token.back()))) co.token.pop_back();
  }
  return co;
}

absl::Status ExplainDaemonError(const std::string& address, const absl::Status& status) {
  if (status.ok()) return status;
  std::string hint;
  const absl::string_view m = status.message();
  if (absl::IsUnavailable(status) && (absl::StrContains(m, "Ssl") || absl::StrContains(m, "SSL"))) {
    hint = "; TLS did not start: a daemon without TLS is reached without --tls-ca, one with TLS with it (and "
           "--tls-server-name when its certificate names another host)";
  } else if (absl::IsUnavailable(status) && absl::StrContains(m, "failed to connect")) {
    hint = "; is conveyord running and listening there? ('conveyor health " + address + "' asks it)";
  } else if (absl::IsUnauthenticated(status)) {
    hint = "; pass the daemon's token with --token-file (or connect through its unix socket)";
  }
  return absl::Status(status.code(), absl::StrCat(address, ": ", m, hint));
}

}  // namespace conveyor::cli
