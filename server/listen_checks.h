// listen_checks.h: what conveyord verifies about its addresses before it serves: a TCP
// address is free (gRPC would otherwise share it with a live daemon through SO_REUSEPORT),
// a unix socket path is not a live daemon's, and a non-loopback address is not left without
// a token by accident.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor {

// True when every address `host` (of "host:port", "[v6]:port") names is a loopback address
// (127.0.0.0/8, ::1, "localhost"). A name that does not resolve counts as not loopback.
bool IsLoopbackListenAddress(const std::string& listen);

// OK when `listen` ("host:port", "[::]:port") can be bound now; port 0 is always free.
// Errors: FailedPrecondition naming the address when it is in use, InvalidArgument when it
// is malformed or does not resolve.
absl::Status CheckTcpAddressFree(const std::string& listen);

// Makes `path` ready for a new unix socket: nothing there, or a stale socket (no process
// accepts on it), which is removed. Errors: FailedPrecondition when a live process answers
// there (another daemon) or when the path is something other than a socket (left alone),
// InvalidArgument when it is longer than a socket path may be.
absl::Status PrepareUnixSocketPath(const std::string& path);

}  // namespace conveyor
