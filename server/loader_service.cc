#include "server/loader_service.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "cuda/ipc.h"
#include "cuda/slot_pool.h"
#include "proto/wire.h"
#include "server/status_convert.h"

namespace conveyor {
namespace {

constexpr size_t kMaxName = 256;
constexpr size_t kMaxCursor = 4096;

}  // namespace

// ------------------------------------------------------------------ StreamReactor

StreamReactor::StreamReactor(LoaderService* service) : service_(service) {
  if (service_->options_.metrics) service_->options_.metrics->StreamStarted();
  StartRead(&request_);
}

void StreamReactor::Refuse(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  producer_done_ = true;
  FinishLocked(status);
}

void StreamReactor::FinishLocked(const grpc::Status& status) {
  if (finish_called_) return;
  final_status_ = status;
  if (writing_) return;  // OnWriteDone finishes
  finish_called_ = true;
  Finish(status);
}

absl::Status StreamReactor::Subscribe(const v1::Subscribe& s) {
  if (s.dataset().size() > kMaxName) return absl::InvalidArgumentError("dataset name longer than 256 bytes");
  if (s.resume_cursor().size() > kMaxCursor) return absl::InvalidArgumentError("resume cursor longer than 4096 bytes");
  if (s.initial_credits() > service_->options_.max_credits) {
    return absl::InvalidArgumentError(absl::StrCat("initial_credits must be at most ", service_->options_.max_credits));
  }
  if (s.transport() == v1::TRANSPORT_SHARED_MEMORY) {
    if (service_->options_.fd_server == nullptr) {
      return absl::InvalidArgumentError("shared memory needs the daemon's unix socket (started without one)");
    }
    shm_ = true;
  } else if (s.transport() == v1::TRANSPORT_CUDA_IPC) {
    std::string why;
    const int devices = CudaDeviceCount(&why);
    if (devices == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TRANSPORT_CUDA_IPC needs a CUDA device on the daemon's host, and it has none (", why,
          "); subscribe with TRANSPORT_SHARED_MEMORY or TRANSPORT_INLINE"));
    }
    cuda_device_ = s.has_cuda_device() ? s.cuda_device() : service_->options_.cuda_device;
    if (cuda_device_ < 0 || cuda_device_ >= devices) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_device ", cuda_device_, " is not one of the daemon's ", devices,
                                                     " CUDA device(s)"));
    }
    cuda_ipc_ = true;
  } else if (s.transport() != v1::TRANSPORT_INLINE) {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport ", static_cast<int>(s.transport())));
  }
  auto ds = service_->registry_->Find(s.dataset());
  if (!ds.ok()) return ds.status();
  dataset_ = *ds;
  StreamRequest r;
  if (s.layouts_size() > 1024) return absl::InvalidArgumentError("at most 1024 layouts");
  for (const auto& [name, layout] : s.layouts()) {
    auto l = LayoutFromProto(layout);
    if (!l.ok()) return absl::InvalidArgumentError(absl::StrCat(l.status().message(), " for stream '", name.substr(0, 64), "'"));
    r.layouts[name] = *l;
  }
  if (s.has_randomize()) r.randomize = s.randomize();
  if (s.has_seed()) r.seed = s.seed();
  r.minibatch_size = s.minibatch_size();
  r.epochs = s.epochs() == 0 ? 1 : s.epochs();
  if (s.has_epoch_size()) r.epoch_size = s.epoch_size();
  if (s.has_rank()) r.rank = s.rank();
  if (s.has_world()) r.world = s.world();
  if (s.has_frame_mode()) r.frame_mode = s.frame_mode();
  if (s.minibatch_mode() == v1::MINIBATCH_MODE_FULL) r.full_minibatches = true;
  if (s.minibatch_mode() == v1::MINIBATCH_MODE_PARTIAL) r.full_minibatches = false;
  if (s.parallel() > 0 && s.truncation() == 0) return absl::InvalidArgumentError("parallel needs truncation");
  if (s.truncation() > (1u << 20)) return absl::InvalidArgumentError("truncation must be at most 2^20");
  r.truncation = s.truncation();
  r.parallel = s.parallel();
  r.resume = s.resume_cursor();
  r.threads = service_->options_.parser_threads_per_stream;
  auto resolved = ResolveStream(*dataset_, r);
  if (!resolved.ok()) return resolved.status();
  resolved_ = std::move(*resolved);
  resolved_.loader.pool = service_->pool_.get();
  std::string note;
  if (cuda_ipc_) {  // batches are assembled where they travel from: device memory
    auto cuda = MakeCudaAssembler(cuda_device_, service_->options_.staging_bytes);
    if (!cuda.ok()) return cuda.status();
    assembler_ = std::move(*cuda);
  } else {
    // The CUDA assembler overlaps by itself (the device assembles batch k while the host
    // plans k+1). The CPU one stays synchronous: on a worker thread of its own it cost CPU
    // time and gained no throughput here (bench/RESULTS.md, "Pipelined assembly").
    assembler_ = SelectAssembler(service_->options_.cuda_assembler, service_->options_.cuda_device, &note,
                                 service_->options_.staging_bytes);
    if (service_->options_.pipelined_cpu_assembly && !assembler_->pipelined()) {
      assembler_ = MakePipelinedAssembler(std::move(assembler_));
    }
  }
  auto loader = Loader::Create(dataset_.get(), assembler_.get(), resolved_.loader);
  if (!loader.ok()) return loader.status();
  loader_ = std::move(*loader);
  credits_ = s.initial_credits() == 0 ? service_->options_.default_credits : s.initial_credits();
  slots_per_segment_ = credits_;
  return absl::OkStatus();
}

absl::StatusOr<StreamReactor::SlotRef> StreamReactor::ReserveSlot(uint64_t serial, uint64_t bytes,
                                                                 std::vector<v1::StreamResponse>* messages) {
  std::unique_lock<std::mutex> lock(mu_);
  if (segments_.empty() || segments_.back().slot_bytes < bytes) {
    // A new segment, with headroom over this batch in every slot; slots stay 256-byte
    // aligned so that the arrays inside keep their alignment.
    const uint64_t want = static_cast<uint64_t>(service_->options_.slot_headroom * static_cast<double>(bytes));
    const uint64_t slot = std::max<uint64_t>(service_->options_.min_slot_bytes, (std::max<uint64_t>(want, bytes) + 255) / 256 * 256);
    Segment seg;
    v1::StreamResponse announce;
    if (cuda_ipc_) {
      lock.unlock();
      const uint64_t bytes_total = slot * slots_per_segment_;
      auto block = gpu::AllocateMemory(gpu::MemoryKind::kDevice, bytes_total, cuda_device_);
      if (!block.ok()) return block.status();
      const int device = cuda_device_;
      seg.device = std::shared_ptr<void>(*block, [device](void* p) { gpu::FreeMemory(gpu::MemoryKind::kDevice, p, device); });
      auto handle = gpu::ExportIpcHandle(seg.device.get(), device);
      if (!handle.ok()) return handle.status();
      auto uuid = gpu::DeviceUuid(device);
      if (!uuid.ok()) return uuid.status();
      lock.lock();
      seg.id = static_cast<uint32_t>(segments_.size());
      v1::CudaIpcSegment* a = announce.mutable_cuda_segment();
      a->set_id(seg.id);
      a->set_bytes(bytes_total);
      a->set_handle(*handle);
      a->set_device_uuid(*uuid);
      a->set_device(device);
    } else {
      lock.unlock();
      auto shm = ShmSegment::Create(slot * slots_per_segment_);
      if (!shm.ok()) return shm.status();
      lock.lock();
      seg.id = static_cast<uint32_t>(segments_.size());
      seg.shm = *shm;
      seg.token = service_->options_.fd_server->Register(seg.shm);
      v1::SharedMemorySegment* a = announce.mutable_segment();
      a->set_id(seg.id);
      a->set_bytes(seg.shm->size());
      a->set_token(seg.token);
      a->set_fd_socket(service_->options_.fd_server->path());
    }
    seg.slot_bytes = slot;
    for (uint32_t i = slots_per_segment_; i > 0; --i) seg.free_slots.push_back(i - 1);
    messages->push_back(std::move(announce));
    segments_.push_back(std::move(seg));
  }
  Segment& seg = segments_.back();
  if (seg.free_slots.empty()) return absl::InternalError("no free shared-memory slot (credits exceed slots)");
  const uint32_t slot = seg.free_slots.back();
  seg.free_slots.pop_back();
  slot_of_serial_[serial] = {seg.id, slot};
  SlotRef ref;
  ref.segment = seg.id;
  ref.offset = uint64_t{slot} * seg.slot_bytes;
  ref.data = (seg.device ? static_cast<std::byte*>(seg.device.get()) : seg.shm->data()) + ref.offset;
  return ref;
}

void StreamReactor::OnReadDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ok) {  // the client closed its side (or the call ended)
    if (!subscribed_) {
      producer_done_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the stream closed before a subscribe message"));
    }
    return;
  }
  if (finish_called_ || !final_status_.ok()) return;
  if (!subscribed_) {
    if (!request_.has_subscribe()) {
      producer_done_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message must be a subscribe"));
      return;
    }
    absl::Status st = Subscribe(request_.subscribe());
    if (!st.ok()) {
      producer_done_ = true;
      FinishLocked(ToGrpc(st));
      return;
    }
    subscribed_ = true;
    producer_ = std::thread([this] { Produce(); });
  } else if (request_.has_ack()) {
    if (outstanding_.erase(request_.ack().serial()) == 0) {
      stop_ = true;
      cv_.notify_all();
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                absl::StrCat("ack for batch ", request_.ack().serial(), ", which is not outstanding")));
      return;
    }
    ++credits_;
    if (service_->options_.metrics) service_->options_.metrics->InFlight(-1);
    if (auto it = slot_of_serial_.find(request_.ack().serial()); it != slot_of_serial_.end()) {
      segments_[it->second.first].free_slots.push_back(it->second.second);
      slot_of_serial_.erase(it);
    }
    cv_.notify_all();
  } else {
    stop_ = true;
    cv_.notify_all();
    FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected an ack after the subscribe"));
    return;
  }
  lock.unlock();
  StartRead(&request_);
}

void StreamReactor::Produce() {
  // Up to two batches in flight: batch k+1 is planned and begun while batch k is assembled
  // (by the device: CUDA IPC, --assembler cuda), and k is published once it is complete.
  // Each batch begun holds a credit until it is published. The CPU assembler completes a
  // batch as it begins it: one at a time.
  const size_t depth = assembler_->pipelined() ? 2 : 1;
  std::deque<std::unique_ptr<BegunBatch>> begun;
  uint64_t serial = next_serial_;  // the next batch to begin (only this thread advances them)
  bool ended = false;
  absl::Status failed;
  while (true) {
    bool may_begin = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (begun.empty() && !ended && failed.ok()) cv_.wait(lock, [&] { return stop_ || credits_ > 0; });
      if (stop_ && !draining_) break;  // cancelled: nothing more is sent
      may_begin = !stop_ && !ended && failed.ok() && credits_ > begun.size() && begun.size() < depth;
    }
    if (may_begin) {
      // The batch is assembled straight into where it travels from: a shared-memory or
      // device slot, or the buffer that becomes the first message's payload.
      auto b = std::make_unique<BegunBatch>();
      b->serial = serial;
      BegunBatch* at = b.get();
      auto destination = [this, at](uint64_t size) -> absl::StatusOr<absl::Span<std::byte>> {
        if (shm_ || cuda_ipc_) {
          auto reserved = ReserveSlot(at->serial, size, &at->messages);
          if (!reserved.ok()) return reserved.status();
          at->slot = *reserved;
          return absl::MakeSpan(at->slot.data, size);
        }
        at->payload.resize(size);
        return absl::MakeSpan(reinterpret_cast<std::byte*>(at->payload.data()), size);
      };
      auto more = loader_->Begin(destination);
      if (!more.ok()) {
        failed = more.status();  // the batches begun before it are still sent
      } else if (!*more) {
        ended = true;
      } else {
        begun.push_back(std::move(b));
        ++serial;
        continue;  // begin another while this one is assembled, if credits allow
      }
    }
    if (begun.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.ok()) {
        final_status_ = ToGrpc(failed);
        break;
      }
      if (ended) {
        v1::StreamResponse end;
        end.mutable_end()->set_cursor(last_cursor_);
        end.mutable_end()->set_batches(next_serial_);
        queue_.push_back(std::move(end));
        break;
      }
      if (draining_) break;
      continue;  // waits for a credit
    }
    Batch batch;
    absl::Status done = loader_->Complete(&batch);
    if (!done.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      final_status_ = ToGrpc(done);
      break;
    }
    std::unique_ptr<BegunBatch> b = std::move(begun.front());
    begun.pop_front();
    if (!Publish(batch, b.get())) break;
  }
  // Nothing may still write into slots or buffers once this thread is gone.
  while (loader_->in_flight() > 0) {
    Batch discarded;
    (void)loader_->Complete(&discarded);
  }
  std::lock_guard<std::mutex> lock(mu_);
  producer_done_ = true;
  if (draining_ && final_status_.ok()) {
    final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 absl::StrCat("conveyord is shutting down; resume with cursor ", last_cursor_));
  }
  Pump();
}

bool StreamReactor::Publish(const Batch& batch, BegunBatch* b) {
  // Descriptor plus the bytes, split into parts that fit a message.
  const std::string cursor = resolved_.Encode(batch.after);
  const uint64_t part = service_->options_.inline_part_bytes;
  const uint64_t total = batch.plan.total_bytes;
  const uint32_t parts = static_cast<uint32_t>(std::max<uint64_t>(1, (total + part - 1) / part));
  v1::StreamResponse first;
  v1::BatchDescriptor* d = first.mutable_batch();
  d->set_serial(b->serial);
  d->set_epoch(batch.epoch);
  d->set_batch(batch.index);
  d->set_end_of_epoch(batch.end_of_epoch);
  d->set_end_of_sweep(batch.end_of_sweep);
  d->set_cursor(cursor);
  d->set_parts(parts);
  PlanToDescriptor(batch.plan, d);
  std::vector<v1::StreamResponse> rest;
  if (shm_) {
    d->set_parts(0);
    d->mutable_shm()->set_segment(b->slot.segment);
    d->mutable_shm()->set_offset(b->slot.offset);
  } else if (cuda_ipc_) {
    d->set_parts(0);
    d->mutable_cuda_ipc()->set_segment(b->slot.segment);
    d->mutable_cuda_ipc()->set_offset(b->slot.offset);
  } else {
    // Parts after the first are copied out; the first keeps the assembled buffer itself.
    for (uint64_t off = part; off < total; off += part) {
      v1::StreamResponse more_msg;
      more_msg.mutable_more()->set_serial(b->serial);
      more_msg.mutable_more()->mutable_payload()->set_offset(off);
      more_msg.mutable_more()->mutable_payload()->set_data(b->payload.data() + off, std::min(part, total - off));
      rest.push_back(std::move(more_msg));
    }
    b->payload.resize(std::min(part, total));
    d->mutable_payload()->set_offset(0);
    d->mutable_payload()->set_data(std::move(b->payload));
  }
  b->messages.push_back(std::move(first));  // after a new segment's announcement
  for (auto& m : rest) b->messages.push_back(std::move(m));
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ && !draining_) return false;  // cancelled while making it
  --credits_;
  ++next_serial_;
  outstanding_.insert(b->serial);
  if (Metrics* m = service_->options_.metrics) {
    m->Served(dataset_->config().name, shm_ ? "shm" : cuda_ipc_ ? "cuda_ipc" : "inline", total, batch.plan.num_samples);
    m->InFlight(1);
    const double parsed = loader_->pipeline().parse_seconds();
    m->Parsed(dataset_->config().name, parsed - parse_seconds_reported_);
    parse_seconds_reported_ = parsed;
    m->Occupancy(dataset_->config().name, dataset_->resident_chunks(), dataset_->resident_bytes(),
                 service_->pool_->queued(), service_->pool_->busy());
  }
  last_cursor_ = cursor;
  for (auto& m : b->messages) queue_.push_back(std::move(m));
  Pump();
  return true;
}

void StreamReactor::Pump() {
  if (finish_called_ || writing_) return;
  if (!queue_.empty()) {
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&current_);
    return;
  }
  if (producer_done_) {
    finish_called_ = true;
    Finish(final_status_);
  }
}

void StreamReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) {  // the client went away
    stop_ = true;
    cv_.notify_all();
    queue_.clear();
    if (!finish_called_) {
      finish_called_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
    }
    return;
  }
  if (!final_status_.ok() && !finish_called_ && (stop_ || producer_done_) && !draining_) {
    // An error while a write was in flight: finish now.
    queue_.clear();
    finish_called_ = true;
    Finish(final_status_);
    return;
  }
  Pump();
}

void StreamReactor::OnCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
  queue_.clear();
  if (!finish_called_ && !writing_) {
    finish_called_ = true;
    Finish(grpc::Status::CANCELLED);
  } else if (!finish_called_) {
    final_status_ = grpc::Status::CANCELLED;
  }
}

void StreamReactor::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  stop_ = true;
  cv_.notify_all();
  if (!subscribed_) {
    producer_done_ = true;
    final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "conveyord is shutting down");
  }
  Pump();
}

void StreamReactor::OnDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (producer_.joinable()) producer_.join();
  if (Metrics* m = service_->options_.metrics) {
    m->InFlight(-static_cast<double>(outstanding_.size()));
    m->StreamEnded(final_status_.error_code());
  }
  loader_.reset();
  for (const Segment& seg : segments_) service_->options_.fd_server->Forget(seg.token);
  segments_.clear();
  service_->Unregister(this);
  delete this;
}

// ------------------------------------------------------------------ LoaderService

LoaderService::LoaderService(std::unique_ptr<DatasetRegistry> registry, ServiceOptions options)
    : registry_(std::move(registry)), options_(options),
      pool_(std::make_unique<ParserPool>(options_.parser_threads > 0
                                             ? options_.parser_threads
                                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))) {}

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

grpc::ServerUnaryReactor* LoaderService::ListDatasets(grpc::CallbackServerContext* ctx,
                                                      const v1::ListDatasetsRequest*,
                                                      v1::ListDatasetsResponse* resp) {
  auto* r = ctx->DefaultReactor();
  grpc::Status auth = Authorize(ctx);
  if (!auth.ok()) {
    r->Finish(auth);
    return r;
  }
  for (const std::string& n : registry_->Names()) resp->add_datasets(n);
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* LoaderService::DescribeDataset(grpc::CallbackServerContext* ctx,
                                                         const v1::DescribeDatasetRequest* req,
                                                         v1::DatasetDescription* resp) {
  auto* r = ctx->DefaultReactor();
  grpc::Status auth = Authorize(ctx);
  if (!auth.ok()) {
    r->Finish(auth);
    return r;
  }
  if (req->dataset().size() > kMaxName) {
    r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "dataset name longer than 256 bytes"));
    return r;
  }
  auto ds = registry_->Find(req->dataset());
  if (!ds.ok()) {
    r->Finish(ToGrpc(ds.status()));
    return r;
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
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* LoaderService::Stream(grpc::CallbackServerContext* ctx) {
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
                           absl::StrCat("more than ", options_.max_subscriptions, " subscriptions")));
  }
  return r;
}

void LoaderService::Unregister(StreamReactor* r) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(r);
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
