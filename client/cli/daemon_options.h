// daemon_options.h: what the commands that talk to a running conveyord share (subscribe,
// datasets, bench given an address): TLS and token options, and errors that say what to do.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/conveyor_client.h"

#include <CLI/CLI.hpp>

namespace conveyor::cli {

// Each comma-separated address with a bare socket path ("/run/conveyor/conveyord.sock",
// "./d.sock") made the gRPC target of that unix socket (gRPC would take it for a host name);
// other addresses as they are.
std::string DaemonTarget(const std::string& address);

struct DaemonConnectionArgs {
  std::string tls_ca, tls_server_name, token_file;
  bool any() const { return !tls_ca.empty() || !tls_server_name.empty() || !token_file.empty(); }
};
// --tls-ca, --tls-server-name, --token-file; `prefix` starts each description (e.g. "From a
// daemon: ").
void AddDaemonConnectionOptions(CLI::App* cmd, DaemonConnectionArgs* args, const std::string& prefix = "");
// What the options alone get wrong (InvalidArgument, for FailUsage): a server name without
// --tls-ca.
absl::Status CheckDaemonConnectionArgs(const DaemonConnectionArgs& args);
// The client options they make (files read and checked: one unreadable, a --tls-ca file
// without a PEM certificate, an empty token file are errors naming the file).
absl::StatusOr<ClientOptions> MakeClientOptions(const DaemonConnectionArgs& args);
// `status` from a call to the daemon at `address` made with `connection`, with what a person
// can do about the usual failures: nothing listening there, a name that does not resolve, a
// token missing or wrong, TLS against plaintext and back, a certificate of other roots or
// another name, a connection that broke (`received`: the call had delivered something). The
// address is named unless the message names it already.
absl::Status ExplainDaemonError(const std::string& address, const absl::Status& status,
                                const DaemonConnectionArgs& connection, bool received = false);

}  // namespace conveyor::cli
