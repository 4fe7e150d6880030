// health_service.h: grpc.health.v1.Health for probes and load balancers. Check answers
// SERVING for the server as a whole ("") and for conveyor.v1.Loader, NOT_SERVING once the
// daemon drains, NOT_FOUND for other names. Watch sends the status at once and again at each
// change, for at most `max_watches` calls at a time (more are RESOURCE_EXHAUSTED): health
// calls need no token, and gRPC's own service kept every Watch open without a bound (about
// 17 KB of daemon memory each: a peer opening 128,000 of them held 2 GB).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <mutex>
#include <set>

#include "grpc/health/v1/health.grpc.pb.h"

namespace conveyor {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  static constexpr size_t kDefaultMaxWatches = 256;
  explicit HealthService(size_t max_watches = kDefaultMaxWatches) : max_watches_(max_watches) {}
  // Every Watch must have ended (the server shut down) before the service goes.
  ~HealthService() override = default;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest* request) override;

  // NOT_SERVING from now on when false (the daemon drains); watchers are told.
  void SetServing(bool serving);
  size_t watches() const;

 private:
  class Watcher;
  // The status of a service name: SERVING/NOT_SERVING for "" and the Loader, else SERVICE_UNKNOWN.
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusLocked(const std::string& service) const;

  const size_t max_watches_;
  mutable std::mutex mu_;
  bool serving_ = true;
  std::set<Watcher*> watchers_;
};

}  // namespace conveyor
