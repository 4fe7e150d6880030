// server_builder.h: what conveyord sets on its grpc::ServerBuilder and ServiceOptions beyond
// addresses and credentials: HTTP/2 keepalive (a client that vanishes or freezes is noticed
// within seconds and its subscription freed) and the config's memory budgets.
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/config/dataset_config.h"
#include "server/service_options.h"

namespace conveyor {

// Keepalive pings every options.keepalive_time_ms (a peer silent for keepalive_timeout_ms
// more is dropped, its calls end), pings allowed without calls, and clients allowed to ping
// every options.min_client_ping_ms without being told to go away.
// At most kMaxStreamsPerConnection calls at once on one connection.
void ConfigureServerBuilder(grpc::ServerBuilder* builder, const ServiceOptions& options);
inline constexpr int kMaxStreamsPerConnection = 128;

// The `server:` block's memory budgets (subscriptionBytes, inFlightBytes, chunkCacheBytes)
// into `options`; keys left out (0) keep the defaults.
void ApplyMemoryBudgets(const Config::Server& server, ServiceOptions* options);

}  // namespace conveyor
