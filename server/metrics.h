// metrics.h: the daemon's Prometheus metrics (prometheus-cpp), served over HTTP at
// /metrics when conveyord runs with --metrics ADDR. What an operator alerts on: batches,
// bytes and samples served, parse time, active subscriptions, batches in flight (sent, not
// acknowledged: per-subscription lag summed), stream errors by gRPC code.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace conveyor {

class Metrics {
 public:
  Metrics();
  // Serves /metrics on `address` ("host:port", port 0 picks one). Throws nothing; returns
  // the port, or 0 when it cannot listen.
  int Serve(const std::string& address);

  void Served(const std::string& dataset, const std::string& transport, uint64_t bytes, uint64_t samples);
  void Parsed(const std::string& dataset, double seconds);
  void StreamStarted();
  void StreamEnded(int grpc_code);
  void InFlight(double delta);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>& batches_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& parse_seconds_;
  prometheus::Family<prometheus::Counter>& stream_ends_;
  prometheus::Gauge& active_;
  prometheus::Gauge& in_flight_;
};

}  // namespace conveyor
