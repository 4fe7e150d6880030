#include "server/server_builder.h"

namespace conveyor {

void ConfigureServerBuilder(grpc::ServerBuilder* builder, const ServiceOptions& options) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients ping as often as their keepalive says (conveyor's: every few seconds); the
  // default (5 minutes, then GOAWAY after two strikes) would cut them off.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, options.min_client_ping_ms);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; gRPC's own
  // default is unlimited): a trainer needs a few, and a peer opening thousands (health Watch
  // streams, calls that never subscribe) would hold memory for each. A client past it waits
  // for a slot rather than failing.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
}

void ApplyMemoryBudgets(const Config::Server& server, ServiceOptions* options) {
  if (server.subscription_bytes > 0) options->subscription_bytes = server.subscription_bytes;
  if (server.in_flight_bytes > 0) options->in_flight_bytes = server.in_flight_bytes;
  if (server.chunk_cache_bytes > 0) options->chunk_cache_bytes = server.chunk_cache_bytes;
}

}  // namespace conveyor
