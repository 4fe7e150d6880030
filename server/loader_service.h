// loader_service.h: conveyor.v1.Loader on gRPC's callback API. Unary calls answer from the
// registry; each Stream call gets a StreamReactor (stream_reactor.h) that owns its
// subscription. The service owns what subscriptions share: the parser pool, the daemon's
// budget for batches in flight, the chunk cache's budget and the thread that gives freed
// memory back to the system.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/sampling/parser_pool.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "server/dataset_registry.h"
#include "server/memory_budget.h"
#include "server/metrics.h"
#include "server/service_options.h"
#include "server/shared_memory.h"
#include "server/stream_reactor.h"

namespace conveyor {

// Stream is registered raw (ByteBuffers both ways): the reactor writes inline batches from
// their buffers (stream_reactor.h). The wire is the same protobuf.
// The unary calls are raw too, so that a request that does not parse gets INVALID_ARGUMENT
// with a message (and a caller without the token UNAUTHENTICATED first).
using LoaderServiceBase = v1::Loader::WithRawCallbackMethod_ListDatasets<
    v1::Loader::WithRawCallbackMethod_DescribeDataset<v1::Loader::WithRawCallbackMethod_Stream<v1::Loader::Service>>>;

class LoaderService final : public LoaderServiceBase {
 public:
  LoaderService(std::unique_ptr<DatasetRegistry> registry, ServiceOptions options);
  // Waits until every stream's reactor is gone (the server must have been shut down: its
  // OnDone() calls come first); producers stop at once, their loaders cancelled.
  ~LoaderService() override;

  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* DescribeDataset(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                            grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(grpc::CallbackServerContext* ctx) override;

  // Stops new subscriptions and drains the open ones.
  void Drain();
  // Streams whose reactor still exists (until both the call and its producer have ended).
  size_t active_streams() const;
  // Bytes of batches in flight, all subscriptions together (the daemon's budget in use).
  uint64_t in_flight_bytes() const { return in_flight_.used(); }

 private:
  friend class StreamReactor;
  grpc::Status DoListDatasets(const v1::ListDatasetsRequest& req, v1::ListDatasetsResponse* resp);
  grpc::Status DoDescribeDataset(const v1::DescribeDatasetRequest& req, v1::DatasetDescription* resp);
  void Unregister(StreamReactor* r);
  // OK for unix-socket peers and for TCP calls with the right bearer token.
  grpc::Status Authorize(grpc::CallbackServerContext* ctx) const;

  const std::unique_ptr<DatasetRegistry> registry_;
  const ServiceOptions options_;
  const std::unique_ptr<ParserPool> own_pool_;
  ParserPool* const pool_;
  MemoryBudget in_flight_;
  const uint64_t chunk_cache_bytes_;
  MemoryReleaser releaser_;
  mutable std::mutex mu_;
  std::condition_variable gone_;
  std::set<StreamReactor*> streams_;
  bool draining_ = false;
  // Ends Stream calls that have not subscribed within options_.subscribe_timeout_ms.
  void ExpireLoop();
  bool stopping_ = false;  // (mu_) the expiry thread ends
  std::condition_variable stop_cv_;
  std::thread expiry_;
};

}  // namespace conveyor
