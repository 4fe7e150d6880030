// test_daemon.h: what the service tests share: an in-process daemon (the real LoaderService
// on a real gRPC server, 127.0.0.1 port 0 and a unix socket with shared memory), the
// subscribe message they use, a subscription read to its end in the dump format, the local
// dump it must equal, and raw streams that bypass the client library.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/conveyor_client.h"
#include "common/sampling/stream_request.h"
#include "server/loader_service.h"
#include "server/server_builder.h"
#include "tests/test_util.h"

namespace conveyor::testing {

// examples/conveyor.yaml: datasets simple, sparse and sequences.
extern const std::string kExamples;

class Daemon {
 public:
  explicit Daemon(ServiceOptions options = {}, const std::string& config_path = kExamples);
  ~Daemon();
  std::string tcp() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string unix_socket() const { return "unix:" + socket_; }
  const std::string& fd_socket() const { return fd_server_->path(); }
  LoaderService& service() { return *service_; }

 private:
  TempDir dir_;
  std::unique_ptr<FdServer> fd_server_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string socket_;
};

v1::Subscribe Sub(const std::string& dataset, uint64_t mb, bool randomize = true, uint64_t seed = 3);

// Everything a subscription delivers (at most `max_batches`), in the dump format.
absl::StatusOr<std::string> Drain(Subscription* sub, uint64_t max_batches = UINT64_MAX);

// What `conveyor dump` prints for a dataset of examples/conveyor.yaml (randomized, seed 3
// unless `extra` says otherwise), cursors included.
std::string LocalDump(const std::string& dataset, uint64_t mb, const StreamRequest& extra = {},
                      const std::string& config_path = kExamples);

// The keys of a dump, one per line.
std::multiset<std::string> Keys(const std::string& dump);

// Sends `requests` on a raw Stream call (no client library), reads until the end, and
// returns the call's status.
grpc::Status RawStream(const std::string& address, const std::vector<v1::StreamRequest>& requests);
v1::StreamRequest SubscribeRequest(const v1::Subscribe& s);

// Waits up to `seconds` for `done`; true once it holds.
bool WaitFor(double seconds, const std::function<bool()>& done);

}  // namespace conveyor::testing
