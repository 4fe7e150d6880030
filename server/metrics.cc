#include "server/metrics.h"

#include <algorithm>

#include <exception>
#include <string>
#include <vector>

namespace conveyor {

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      batches_(prometheus::BuildCounter().Name("conveyor_batches_served_total").Help("Batches sent to subscribers").Register(*registry_)),
      bytes_(prometheus::BuildCounter().Name("conveyor_bytes_served_total").Help("Bytes of batches sent (inline or shared)").Register(*registry_)),
      samples_(prometheus::BuildCounter().Name("conveyor_samples_served_total").Help("Minibatch samples sent").Register(*registry_)),
      parse_seconds_(prometheus::BuildCounter().Name("conveyor_parse_seconds_total").Help("Parser thread time").Register(*registry_)),
      stream_ends_(prometheus::BuildCounter().Name("conveyor_streams_ended_total").Help("Stream calls ended, by gRPC status code").Register(*registry_)),
      active_(prometheus::BuildGauge().Name("conveyor_active_streams").Help("Open Stream calls").Register(*registry_).Add({})),
      in_flight_(prometheus::BuildGauge().Name("conveyor_batches_in_flight").Help("Batches sent and not yet acknowledged, all subscriptions (lag)").Register(*registry_).Add({})),
      cache_chunks_(prometheus::BuildGauge().Name("conveyor_chunk_cache_chunks").Help("Parsed chunks held in memory, by dataset").Register(*registry_)),
      cache_bytes_(prometheus::BuildGauge().Name("conveyor_chunk_cache_bytes").Help("Heap bytes of parsed chunks held, by dataset").Register(*registry_)),
      parse_queue_(prometheus::BuildGauge().Name("conveyor_parse_jobs_queued").Help("Chunk parses waiting for a parser thread").Register(*registry_).Add({})),
      parsers_busy_(prometheus::BuildGauge().Name("conveyor_parser_threads_busy").Help("Parser threads parsing now").Register(*registry_).Add({})),
      chunks_parsed_(prometheus::BuildCounter().Name("conveyor_chunks_parsed_total").Help("Chunks parsed, by dataset (subscriptions sharing a chunk parse it once)").Register(*registry_)) {}

int Metrics::Serve(const std::string& address) {
  try {
    // CivetWeb serves a connection per thread and waits 30 s by default for a request's
    // headers: with its default of 2 threads, two connections that sent half a request kept
    // every scrape out for half a minute. More threads, and 3 s to send a request.
    exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "16", "request_timeout_ms", "3000"});
    exposer_->RegisterCollectable(registry_);
    auto ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  } catch (const std::exception&) {
    return 0;
  }
}

void Metrics::Served(const std::string& dataset, const std::string& transport, uint64_t bytes, uint64_t samples) {
  batches_.Add({{"dataset", dataset}, {"transport", transport}}).Increment();
  bytes_.Add({{"dataset", dataset}, {"transport", transport}}).Increment(static_cast<double>(bytes));
  samples_.Add({{"dataset", dataset}, {"transport", transport}}).Increment(static_cast<double>(samples));
}

void Metrics::Parsed(const std::string& dataset, double seconds) {
  if (seconds > 0) parse_seconds_.Add({{"dataset", dataset}}).Increment(seconds);
}

void Metrics::StreamStarted() { active_.Increment(); }

void Metrics::StreamEnded(int code) {
  active_.Decrement();
  stream_ends_.Add({{"code", std::to_string(code)}}).Increment();
}

void Metrics::InFlight(double delta) { in_flight_.Increment(delta); }

void Metrics::Occupancy(const std::string& dataset, uint64_t resident_chunks, uint64_t resident_bytes,
                        size_t parse_jobs_queued, size_t parser_threads_busy) {
  cache_chunks_.Add({{"dataset", dataset}}).Set(static_cast<double>(resident_chunks));
  cache_bytes_.Add({{"dataset", dataset}}).Set(static_cast<double>(resident_bytes));
  parse_queue_.Set(static_cast<double>(parse_jobs_queued));
  parsers_busy_.Set(static_cast<double>(parser_threads_busy));
}

void Metrics::ChunkParses(const std::string& dataset, uint64_t parses) {
  std::lock_guard<std::mutex> lock(parses_mu_);
  uint64_t& reported = parses_reported_[dataset];
  if (parses > reported) chunks_parsed_.Add({{"dataset", dataset}}).Increment(static_cast<double>(parses - reported));
  reported = std::max(reported, parses);
}

}  // namespace conveyor
