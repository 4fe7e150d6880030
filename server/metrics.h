// metrics.h: the daemon's Prometheus metrics (prometheus-cpp), served over HTTP at
// /metrics when conveyord runs with --metrics ADDR. What an operator alerts on: batches,
// bytes and samples served, parse time, active subscriptions, batches in flight (sent, not
// acknowledged: per-subscription lag summed), stream errors by gRPC code, chunk cache and
// parser queue occupancy, chunks parsed.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
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
  // The chunk cache of `dataset` (parsed chunks held by readers) and the shared parser pool.
  void Occupancy(const std::string& dataset, uint64_t resident_chunks, uint64_t resident_bytes, size_t parse_jobs_queued,
                 size_t parser_threads_busy);
  // `dataset` has parsed `parses` chunks since it opened (Dataset::parses(); subscriptions
  // sharing a chunk parse it once): conveyor_chunks_parsed_total.
  void ChunkParses(const std::string& dataset, uint64_t parses);

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
  prometheus::Family<prometheus::Gauge>& cache_chunks_;
  prometheus::Family<prometheus::Gauge>& cache_bytes_;
  prometheus::Gauge& parse_queue_;
  prometheus::Gauge& parsers_busy_;
  prometheus::Family<prometheus::Counter>& chunks_parsed_;
  std::mutex parses_mu_;
  std::map<std::string, uint64_t> parses_reported_;  // by dataset
};

}  // namespace conveyor
