// daemon_options.h: what the commands that talk to a running conveyord share (subscribe,
// datasets, bench given an address): TLS and token options, and errors that say what to do.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/conveyor_client.h"

#include <CLI/CLI.hpp>

namespace conveyor::cli {

// A bare socket path ("/run/conveyor/conveyord.sock", "./d.sock") as the gRPC target of that
// unix socket (gRPC would take it for a host name); other addresses as they are.
std::string DaemonTarget(const std::string& address);

struct DaemonConnectionArgs {
  std::string tls_ca, tls_server_name, token_file;
};
// --tls-ca, --tls-server-name, --token-file.
void AddDaemonConnectionOptions(CLI::App* cmd, DaemonConnectionArgs* args);
// The client options they make (files read: an unreadable one is an error naming it).
absl::StatusOr<ClientOptions> MakeClientOptions(const DaemonConnectionArgs& args);
// `status` from a call to the daemon at `address`, with what a person can do about the usual
// failures: nothing listening there, a token missing or wrong, TLS against plaintext.
absl::Status ExplainDaemonError(const std::string& address, const absl::Status& status);

}  // namespace conveyor::cli
