// service_options.h: what conveyord's service is configured with (flags and the config's
// `server:` block, docs/design.md section 3): threads, transports, credits, memory budgets,
// keepalives, authentication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace conveyor {

class FdServer;
class Metrics;
class ParserPool;

struct ServiceOptions {
  uint64_t inline_part_bytes = 1u << 20;  // bytes of a batch per message
  uint32_t default_credits = 4;
  uint32_t max_credits = 64;
  int parser_threads = 0;             // the daemon's parser pool, shared by all subscriptions; 0: cores
  int parser_threads_per_stream = 2;  // chunks one subscription parses at once (from the pool)
  ParserPool* parser_pool = nullptr;  // not owned; nullptr: the service makes its own (parser_threads)
  size_t max_subscriptions = 256;
  // A Stream call must send its subscribe message within this long, or it ends with
  // DEADLINE_EXCEEDED: calls that never subscribe would otherwise hold the subscription
  // slots (max_subscriptions) for as long as their peer keeps the connection.
  int subscribe_timeout_ms = 10000;
  // A stream that has sent its end waits for the client to close its side (a shared-memory
  // client may still fetch a batch's segment), and holds its slot meanwhile: at most this
  // long once every batch is acknowledged, or end_idle_ms after the end or the last
  // acknowledgement while some are not; then it finishes OK.
  int end_grace_ms = 30000;
  int end_idle_ms = 600000;
  FdServer* fd_server = nullptr;  // enables TRANSPORT_SHARED_MEMORY; not owned
  uint64_t min_slot_bytes = 1u << 20;  // shared memory: smallest slot
  double slot_headroom = 2.0;          // shared memory: a new segment's slots fit this x the batch
  Metrics* metrics = nullptr;          // not owned; optional
  std::string token;                   // non-empty: TCP calls need "authorization: Bearer <token>"
  bool cuda_assembler = false;         // assemble on the GPU (falls back to the CPU, logged once)
  int cuda_device = 0;
  uint64_t staging_bytes = 0;  // the CUDA assembler's pinned staging buffers (0: its default)
  // The CPU assembler on a worker thread per stream, two batches in flight as with CUDA. Off:
  // it gained nothing on the machines measured (bench/RESULTS.md); tests run the daemon's
  // pipelined path with it, which CUDA streams take on a GPU host.
  bool pipelined_cpu_assembly = false;

  // Memory budgets (docs/design.md section 9), checked before anything is allocated; what
  // does not fit is RESOURCE_EXHAUSTED naming the budget.
  // One subscription: credits x its largest batch (inline buffers, shared-memory or device
  // segments), and the bookkeeping of a minibatch's pieces (server.subscriptionBytes).
  uint64_t subscription_bytes = uint64_t{1} << 30;
  // Every subscription's batches in flight together (server.inFlightBytes); 0: half of the
  // machine's memory.
  uint64_t in_flight_bytes = 0;
  // Parsed chunks of every dataset together (server.chunkCacheBytes); 0: half of the
  // machine's memory.
  uint64_t chunk_cache_bytes = 0;

  // HTTP/2 keepalive pings on every connection: a peer that does not answer one within the
  // timeout is gone (a frozen or vanished client frees its subscription). Clients may ping
  // as often as every `min_client_ping_ms`.
  int keepalive_time_ms = 10000;
  int keepalive_timeout_ms = 5000;
  int min_client_ping_ms = 1000;
};

}  // namespace conveyor
