#include "client/cli/daemon_options.h"

#include <cctype>

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/mapped_file.h"

namespace conveyor::cli {

std::string DaemonTarget(const std::string& address) {
  std::vector<std::string> parts = absl::StrSplit(address, ',');
  for (std::string& a : parts) {
    if (!a.empty() && (a[0] == '/' || a.rfind("./", 0) == 0 || a.rfind("../", 0) == 0)) a = "unix:" + a;
  }
  return absl::StrJoin(parts, ",");
}

void AddDaemonConnectionOptions(CLI::App* cmd, DaemonConnectionArgs* args, const std::string& prefix) {
  cmd->add_option("--tls-ca", args->tls_ca,
                  prefix + "PEM roots to trust: connect with TLS (the daemon's certificate is signed by them)");
  cmd->add_option("--tls-server-name", args->tls_server_name,
                  prefix + "Name the daemon's certificate must carry, if not the address's host (with --tls-ca)");
  cmd->add_option("--token-file", args->token_file,
                  prefix + "File with the bearer token the daemon requires on TCP (its --token-file; not needed on "
                           "its unix socket)");
}

absl::Status CheckDaemonConnectionArgs(const DaemonConnectionArgs& args) {
  if (!args.tls_server_name.empty() && args.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-server-name applies to TLS: give --tls-ca too");
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientOptions> MakeClientOptions(const DaemonConnectionArgs& args) {
  ClientOptions co;
  if (!args.tls_ca.empty()) {
    auto roots = ReadFileToString(args.tls_ca);
    if (!roots.ok()) return roots.status();
    // An empty string would mean plaintext to the client: the token would travel in clear.
    if (!absl::StrContains(*roots, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls-ca ", args.tls_ca, ": no PEM certificate in it (expected a '-----BEGIN CERTIFICATE-----' block)"));
    }
    co.tls_root_certs = *roots;
  }
  co.tls_server_name = args.tls_server_name;
  if (!args.token_file.empty()) {
    auto token = ReadFileToString(args.token_file);
    if (!token.ok()) return token.status();
    co.token = *token;
    while (!co.token.empty() && std::isspace(static_cast<unsigned char>(co.token.back()))) co.token.pop_back();
    if (co.token.empty()) return absl::InvalidArgumentError(absl::StrCat("--token-file ", args.token_file, " is empty"));
  }
  return co;
}

absl::Status ExplainDaemonError(const std::string& address, const absl::Status& status,
                                const DaemonConnectionArgs& connection, bool received) {
  if (status.ok()) return status;
  const absl::string_view m = status.message();
  // OpenSSL (Debian's gRPC) writes "wrong version number", BoringSSL (upstream gRPC)
  // "WRONG_VERSION_NUMBER": both, in any case.
  const std::string lower = absl::AsciiStrToLower(m);
  auto says = [&lower](std::initializer_list<const char*> words) {
    for (const char* w : words)
      if (absl::StrContains(lower, w)) return true;
    return false;
  };
  const bool tls = !connection.tls_ca.empty();
  const std::string first = address.substr(0, address.find(','));
  std::string hint;
  if (absl::IsUnavailable(status)) {
    if (says({"wrong version number", "wrong_version_number"})) {
      hint = "the daemon does not serve TLS there: connect without --tls-ca";
    } else if (says({"certificate verify failed", "certificate_verify_failed", "unknown ca"})) {
      hint = "the daemon's certificate is not signed by the --tls-ca roots: give the CA that signed its --tls-cert";
    } else if (says({"not in peer certificate", "no match found for server name"})) {
      hint = "its certificate is for another name: pass that name with --tls-server-name";
    } else if (says({"ssl", "handshake"})) {
      hint = "TLS did not start: check --tls-ca and --tls-server-name against the daemon's --tls-cert";
    } else if (says({"socket closed", "connection reset"})) {
      hint = received || tls ? "the connection broke (was the daemon stopped or restarted?)"
                             : "the daemon closed the connection at once: one serving TLS is reached with --tls-ca";
    } else if (says({"dns resolution failed"})) {
      hint = "the host name does not resolve";
    } else if (says({"failed to connect"}) && !says({"is conveyord running"})) {
      hint = "is conveyord running and listening there?";
      if (!tls) hint += " ('conveyor health " + first + "' asks it)";
    }
  } else if (absl::IsUnauthenticated(status)) {
    hint = "pass the daemon's token with --token-file (a wrong one is refused alike), or connect through its unix socket";
  }
  const bool named = absl::StrContains(m, "daemon at " + address) || absl::StrContains(m, "daemon at " + DaemonTarget(address));
  return absl::Status(status.code(), absl::StrCat(named ? "" : address + ": ", m, hint.empty() ? "" : "; ", hint));
}

}  // namespace conveyor::cli
