#include "server/loader_service.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "proto/status.h"
#include "proto/wire.h"

namespace conveyor {
namespace {

constexpr size_t kMaxName = 256;

std::unique_ptr<ParserPool> OwnPool(const ServiceOptions& o) {
  if (o.parser_pool != nullptr) return nullptr;
  // Shared by every subscription: its busy threads are not offered to assemble (parser_pool.h).
  return std::make_unique<ParserPool>(
      o.parser_threads > 0 ? o.parser_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
      /*cores=*/0, /*shared=*/true);
}

}  // namespace

// ------------------------------------------------------------------ LoaderService

LoaderService::LoaderService(std::unique_ptr<DatasetRegistry> registry, ServiceOptions options)
    : registry_(std::move(registry)), options_(options), own_pool_(OwnPool(options_)),
      pool_(own_pool_ ? own_pool_.get() : options_.parser_pool),
      in_flight_("the daemon's budget for batches in flight", "server.inFlightBytes",
                 options_.in_flight_bytes > 0 ? options_.in_flight_bytes : DefaultDaemonBudget()),
      chunk_cache_bytes_(options_.chunk_cache_bytes > 0 ? options_.chunk_cache_bytes : DefaultDaemonBudget()) {
  // Ranks and DataLoader workers of one job read the same chunks a few batches apart: chunks
  // recently used stay for them (a quarter of the chunk cache, at most 1 GiB), so that each
  // is parsed once. Dropped first when the cache is full, and when no stream is left. A
  // dataset with keepDataInMemory keeps its chunks (up to the whole chunk cache) for every
  // subscription to come, until the cache needs the room: parsed once per daemon, not once
  // per subscription (a DataLoader's workers subscribe anew every epoch).
  if (registry_ != nullptr) {
    registry_->SetRetainedBytes(std::min<uint64_t>(chunk_cache_bytes_ / 4, uint64_t{1} << 30), chunk_cache_bytes_);
  }
  expiry_ = std::thread([this] { ExpireLoop(); });
}

void LoaderService::ExpireLoop() {
  const std::chrono::milliseconds timeout(std::max(1, options_.subscribe_timeout_ms));
  // Checked a few times a timeout (at most every second): a late call ends within 1.25 of it.
  const auto period = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), std::max(timeout / 4, std::chrono::milliseconds(1)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [&] { return stopping_; })) {
    // Under mu_, as Drain(): a reactor in streams_ is not yet unregistered, so it still exists.
    const auto now = std::chrono::steady_clock::now();
    const auto deadline_for_start = now - timeout;
    for (StreamReactor* r : streams_) {
      if (!r->ExpireUnsubscribed(deadline_for_start, timeout)) (void)r->ExpireEnded(now);
    }
  }
}

LoaderService::~LoaderService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  expiry_.join();
  std::unique_lock<std::mutex> lock(mu_);
  for (StreamReactor* r : streams_) r->Drain();  // cancels producers still running
  gone_.wait(lock, [&] { return streams_.empty(); });
}

grpc::Status LoaderService::Authorize(grpc::CallbackServerContext* ctx) const {
  if (options_.token.empty()) return grpc::Status::OK;
  if (ctx->peer().rfind("unix:", 0) == 0) return grpc::Status::OK;  // file permissions guard it
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string expected = "Bearer " + options_.token;
  if (it != md.end() && it->second.size() == expected.size()) {
    unsigned char diff = 0;  // constant time
    for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned char>(it->second.data()[i] ^ expected[i]);
    if (diff == 0) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a valid 'authorization: Bearer <token>' is required");
}

grpc::Status LoaderService::DoListDatasets(const v1::ListDatasetsRequest&, v1::ListDatasetsResponse* resp) {
  for (const std::string& n : registry_->Names()) resp->add_datasets(n);
  return grpc::Status::OK;
}

grpc::Status LoaderService::DoDescribeDataset(const v1::DescribeDatasetRequest& request, v1::DatasetDescription* resp) {
  const v1::DescribeDatasetRequest* req = &request;
  if (req->dataset().size() > kMaxName) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "dataset name longer than 256 bytes");
  }
  auto ds = registry_->Find(req->dataset());
  if (!ds.ok()) {
    return ToGrpc(ds.status());
  }
  const Dataset& d = **ds;
  const DatasetConfig& c = d.config();
  resp->set_name(c.name);
  for (const StreamConfig& s : d.streams()) {
    v1::StreamInfo* si = resp->add_streams();
    si->set_name(s.name);
    si->set_alias(s.alias);
    si->set_format(ToProto(s.format));
    si->set_dim(s.dim);
    si->set_defines_minibatch_size(s.defines_mb_size);
  }
  for (const auto& dz : c.deserializers) resp->add_deserializers(dz.type);
  resp->set_precision(c.precision == Precision::kFloat ? v1::PRECISION_FLOAT : v1::PRECISION_DOUBLE);
  resp->set_chunks(d.index().chunks.size());
  resp->set_sequences(d.index().sequences.size());
  resp->set_samples(d.index().total_samples);
  resp->set_randomize(c.randomize);
  resp->set_randomization_window(c.randomization_window.value_or(DefaultRandomizationWindow(
      d.index(), c.deserializers[0].chunk_size_in_bytes, c.sample_based_randomization_window)));
  resp->set_frame_mode(c.frame_mode);
  resp->set_randomization_window_in_samples(c.sample_based_randomization_window);
  return grpc::Status::OK;
}

namespace {

// A unary call on raw bytes: the token checked before anything is parsed (UNAUTHENTICATED,
// not a parse error, for a caller without it), a request that does not parse is
// INVALID_ARGUMENT saying so (gRPC's own parse of a typed request answered UNIMPLEMENTED
// with no message), then `handle`.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* RawUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request_bytes,
                                   grpc::ByteBuffer* response_bytes, const grpc::Status& auth, Handle handle) {
  auto* r = ctx->DefaultReactor();
  if (!auth.ok()) {
    r->Finish(auth);
    return r;
  }
  Request request;
  grpc::ByteBuffer copy(*request_bytes);  // (Deserialize takes its buffer; a copy shares the slices)
  if (!grpc::SerializationTraits<Request>::Deserialize(&copy, &request).ok()) {
    r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           absl::StrCat("a message that does not parse as a ", Request::descriptor()->full_name())));
    return r;
  }
  Response response;
  grpc::Status st = handle(request, &response);
  bool own = false;
  if (st.ok()) st = grpc::SerializationTraits<Response>::Serialize(response, response_bytes, &own);
  r->Finish(st);
  return r;
}

}  // namespace

grpc::ServerUnaryReactor* LoaderService::ListDatasets(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                                      grpc::ByteBuffer* resp) {
  return RawUnary<v1::ListDatasetsRequest, v1::ListDatasetsResponse>(
      ctx, req, resp, Authorize(ctx),
      [this](const v1::ListDatasetsRequest& in, v1::ListDatasetsResponse* out) { return DoListDatasets(in, out); });
}

grpc::ServerUnaryReactor* LoaderService::DescribeDataset(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                                         grpc::ByteBuffer* resp) {
  return RawUnary<v1::DescribeDatasetRequest, v1::DatasetDescription>(
      ctx, req, resp, Authorize(ctx),
      [this](const v1::DescribeDatasetRequest& in, v1::DatasetDescription* out) { return DoDescribeDataset(in, out); });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* LoaderService::Stream(grpc::CallbackServerContext* ctx) {
  auto* r = new StreamReactor(this);
  grpc::Status auth = Authorize(ctx);
  std::lock_guard<std::mutex> lock(mu_);
  streams_.insert(r);
  if (!auth.ok()) {
    r->Refuse(auth);
  } else if (draining_) {
    r->Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "conveyord is shutting down"));
  } else if (streams_.size() > options_.max_subscriptions) {
    r->Refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           absl::StrCat("more than ", options_.max_subscriptions,
                                        " subscriptions at once (each DataLoader worker and each rank holds one): the "
                                        "daemon's limit, raised with --max-subscriptions or server.maxSubscriptions")));
  }
  return r;
}

void LoaderService::Unregister(StreamReactor* r) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(r);
  if (registry_ != nullptr) {
    // No stream left: the chunks kept for readers to come go back to the system (not those
    // of datasets with keepDataInMemory: kept for the next subscription).
    if (streams_.empty()) registry_->DropRetainedForReaders();
    // What the chunk cache holds now (batches update it while streams run; none may follow).
    if (Metrics* m = options_.metrics) {
      for (const std::string& name : registry_->Names()) {
        absl::StatusOr<std::shared_ptr<const Dataset>> ds = registry_->Find(name);
        if (ds.ok()) m->Occupancy(name, (*ds)->resident_chunks(), (*ds)->resident_bytes(), pool_->queued(), pool_->busy());
      }
    }
  }
  // The freed heap and huge-page blocks back to the system (on the releaser's thread).
  releaser_.Request();
  gone_.notify_all();  // under the lock: the destructor may run as soon as it is released
}

void LoaderService::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  for (StreamReactor* r : streams_) r->Drain();
}

size_t LoaderService::active_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.size();
}

}  // namespace conveyor
