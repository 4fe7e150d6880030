#include "server/stream_reactor.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "proto/status.h"
#include "proto/wire.h"
#include "server/loader_service.h"

namespace conveyor {
namespace {

// A stream that the data ended (DataLoss: a file changed or cut since it was opened, input
// errors past maxErrors; Internal; ResourceExhausted) is the operator's business too, not only
// the client's: one line on the daemon's stderr, at most once a minute for the same dataset
// and message (a DataLoader re-subscribing every epoch would repeat it).
void LogStreamFailure(const std::string& dataset, const absl::Status& status) {
  if (!absl::IsDataLoss(status) && !absl::IsInternal(status) && !absl::IsResourceExhausted(status)) return;
  static std::mutex mu;
  static std::map<std::string, std::chrono::steady_clock::time_point>* last =
      new std::map<std::string, std::chrono::steady_clock::time_point>();
  const std::string message(status.message());
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu);
    // By dataset, code and what the message is about (up to its first ": ", a file's path):
    // its numbers (a byte offset, bytes left) differ from one failure to the next.
    const std::string key = absl::StrCat(dataset, "\n", status.code(), "\n", message.substr(0, message.find(": ")));
    auto it = last->find(key);
    if (it != last->end() && now - it->second < std::chrono::minutes(1)) return;
    if (last->size() > 4096) {  // forget the entries older than a minute
      for (auto e = last->begin(); e != last->end();) e = now - e->second >= std::chrono::minutes(1) ? last->erase(e) : std::next(e);
    }
    (*last)[key] = now;
  }
  std::fprintf(stderr, "conveyord: dataset '%s': a stream ended with %s: %s\n", dataset.c_str(),
               absl::StatusCodeToString(status.code()).c_str(), message.c_str());
}

}  // namespace

StreamReactor::StreamReactor(LoaderService* service) : service_(service) {
  if (service_->options_.metrics) service_->options_.metrics->StreamStarted();
  StartRead(&request_bytes_);
}

void StreamReactor::Refuse(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  producer_done_ = true;
  FinishLocked(status);
}

bool StreamReactor::ExpireUnsubscribed(std::chrono::steady_clock::time_point deadline_for_start,
                                       std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (subscribed_ || finish_called_ || !final_status_.ok() || started_ > deadline_for_start) return false;
  producer_done_ = true;
  FinishLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("no subscribe message within ", timeout.count() / 1000.0,
                                         " s of the call's start (conveyord --subscribe-timeout)")));
  return true;
}

bool StreamReactor::ExpireEnded(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finish_called_ || writing_ || !queue_.empty() || !end_queued_ || client_closed_ ||
      ended_at_ == std::chrono::steady_clock::time_point{}) {
    return false;
  }
  const ServiceOptions& o = service_->options_;
  const std::chrono::milliseconds wait(std::max(1, outstanding_.empty() ? o.end_grace_ms : o.end_idle_ms));
  if (now - std::max(ended_at_, last_ack_at_) < wait) return false;
  finish_called_ = true;
  Finish(final_status_);
  return true;
}

void StreamReactor::FinishLocked(const grpc::Status& status) {
  if (finish_called_) return;
  final_status_ = status;
  if (writing_) return;  // OnWriteDone finishes
  finish_called_ = true;
  Finish(status);
}

void StreamReactor::StopLocked() {
  stop_ = true;
  if (loader_) loader_->Cancel();
  cv_.notify_all();
}

// ------------------------------------------------------------------ reactions

void StreamReactor::OnReadDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ok) {  // the client closed its side (or the call ended)
    client_closed_ = true;
    if (!subscribed_) {
      producer_done_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the stream closed before a subscribe message"));
      return;
    }
    Pump();  // finishes a stream whose end is sent
    return;
  }
  if (finish_called_ || !final_status_.ok()) return;
  request_.Clear();
  if (!grpc::SerializationTraits<v1::StreamRequest>::Deserialize(&request_bytes_, &request_).ok()) {
    StopLocked();
    producer_done_ = producer_done_ || !subscribed_;
    FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a message that does not parse as a StreamRequest"));
    return;
  }
  if (!subscribed_) {
    if (!request_.has_subscribe()) {
      producer_done_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message must be a subscribe"));
      return;
    }
    subscribed_ = true;
    if (draining_) {
      producer_done_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "conveyord is shutting down"));
      return;
    }
    // Everything that takes time (the dataset's cursor, the loader) happens on the
    // producer's thread.
    subscribe_ = std::move(*request_.mutable_subscribe());
    producer_running_ = true;
    std::thread([this] { Run(); }).detach();
  } else if (request_.has_ack()) {
    const uint64_t serial = request_.ack().serial();
    if (outstanding_.erase(serial) == 0) {
      StopLocked();
      FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                absl::StrCat("ack for batch ", serial, ", which is not outstanding")));
      return;
    }
    ++credits_;
    last_ack_at_ = std::chrono::steady_clock::now();
    if (service_->options_.metrics) service_->options_.metrics->InFlight(-1);
    if (transport_) transport_->Release(serial);
    cv_.notify_all();
  } else {
    StopLocked();
    FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected an ack after the subscribe"));
    return;
  }
  lock.unlock();
  StartRead(&request_bytes_);
}

void StreamReactor::Pump() {
  if (finish_called_ || writing_) return;
  if (!queue_.empty()) {
    OutgoingMessage o = std::move(queue_.front());
    queue_.pop_front();
    current_ = o.Encode();
    // The batch's buffer and budget are held until the write is done; its pages, until
    // gRPC lets go of the slice that sends them.
    current_payload_ = std::move(o.payload);
    current_ends_batch_ = o.ends_batch;
    writing_ = true;
    StartWrite(&current_);
    return;
  }
  if (producer_done_) {
    // After the end of the stream the call (and with it the shared-memory segments its
    // batches lie in) lasts until the client closes its side, as the clients do once they
    // have read the end: a client still fetching a segment's descriptor must find it there.
    // A cancel or a drain ends it at once.
    if (end_queued_ && final_status_.ok() && !client_closed_ && !draining_) {
      if (ended_at_ == std::chrono::steady_clock::time_point{}) ended_at_ = std::chrono::steady_clock::now();
      return;
    }
    finish_called_ = true;
    Finish(final_status_);
  }
}

void StreamReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  current_.Clear();
  current_payload_.reset();  // after a batch's last part, its budget is given back
  if (ok && current_ends_batch_) {
    --unsent_;
    cv_.notify_all();
  }
  current_ends_batch_ = false;
  if (!ok) {  // the client went away
    StopLocked();
    queue_.clear();
    if (!finish_called_) {
      finish_called_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
      Finish(final_status_);
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
  StopLocked();
  queue_.clear();
  if (!finish_called_) final_status_ = grpc::Status::CANCELLED;
  if (!finish_called_ && !writing_) {
    finish_called_ = true;
    Finish(grpc::Status::CANCELLED);
  }
}

void StreamReactor::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  StopLocked();
  if (!producer_running_) {
    producer_done_ = true;
    if (final_status_.ok()) final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "conveyord is shutting down");
  }
  Pump();
}

void StreamReactor::OnDone() {
  bool destroy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    StopLocked();
    queue_.clear();
    destroy = !producer_running_ || producer_exited_;
  }
  if (destroy) Destroy();
}

void StreamReactor::Destroy() {
  {
    std::lock_guard<std::mutex> lock(mu_);  // a drain may still look at the queue
    if (Metrics* m = service_->options_.metrics) {
      m->InFlight(-static_cast<double>(outstanding_.size()));
      m->StreamEnded(final_status_.error_code());
    }
    transport_.reset();
    queue_.clear();
    current_.Clear();
    current_payload_.reset();
  }
  // The producer touches nothing any more: its loader (the parsed chunks it holds) and
  // assembler go now, in the order the destructor would take, so that what the service does
  // once no stream is left (drop the chunks kept for readers, give freed memory back) and
  // what a new subscription's chunk admission sees find this stream's memory freed, not
  // freed a moment later by `delete this`.
  loader_.reset();
  assembler_.reset();
  service_->releaser_.Request();
  service_->Unregister(this);  // the service may be gone after this
  delete this;
}

// ------------------------------------------------------------------ the producer

void StreamReactor::Run() {
  SetupEnv env;
  env.registry = service_->registry_.get();
  env.options = &service_->options_;
  env.pool = service_->pool_;
  env.in_flight = &service_->in_flight_;
  env.chunk_cache_bytes = service_->chunk_cache_bytes_;
  auto setup = SetUpStream(subscribe_, env);
  bool run = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!setup.ok()) {
      final_status_ = ToGrpc(setup.status());
    } else {
      dataset_ = setup->dataset;
      resolved_ = std::move(setup->resolved);
      assembler_ = std::move(setup->assembler);
      loader_ = std::move(setup->loader);
      transport_ = std::move(setup->transport);
      credits_ = setup->credits;
      max_unsent_ = std::max<uint32_t>(1, setup->credits);
      if (stop_) loader_->Cancel();
      run = true;
    }
  }
  // Produce() completes every batch it began before it returns (nothing writes into slots or
  // buffers after it); a loader it never ran began none.
  if (run) Produce();
  std::unique_ptr<Loader> loader;
  std::unique_ptr<BatchAssembler> assembler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    producer_done_ = true;
    if (draining_ && final_status_.ok()) {
      final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   absl::StrCat("conveyord is shutting down; resume with cursor ", last_cursor_));
    }
    loader = std::move(loader_);
    assembler = std::move(assembler_);
    Pump();
  }
  // Waits for this stream's parse jobs: here, not on a gRPC thread.
  loader.reset();
  assembler.reset();
  service_->releaser_.Request();
  bool destroy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    producer_exited_ = true;
    destroy = done_;
  }
  if (destroy) Destroy();
}

void StreamReactor::Produce() {
  // Up to two batches in flight: batch k+1 is planned and begun while batch k is assembled
  // (by the device: CUDA IPC, --assembler cuda; by idle parser-pool threads helping the CPU
  // assembler), and k is published once it is complete. Each batch begun holds a credit
  // until it is published. A CPU assembler without helpers completes a batch as it begins
  // it: one at a time.
  const size_t depth = assembler_->pipelined() ? 2 : 1;
  std::deque<std::unique_ptr<Transport::Destination>> begun;
  // However this ends, batches still in flight are completed before their destinations go
  // (below, `begun` before this): a destination given back may be unmapped (an inline
  // buffer the pool does not keep), and the device, or a helper thread, may still write it.
  absl::Cleanup complete_in_flight = [this] {
    while (loader_->in_flight() > 0) {
      Batch discarded;
      (void)loader_->Complete(&discarded);
    }
  };
  uint64_t serial = 0;  // the next batch to begin (only this thread advances them)
  bool ended = false;
  absl::Status failed;
  // One Batch for every completion: Complete() hands the one it replaces back to the loader,
  // whose next plan reuses its arrays (Publish() copies what it sends).
  Batch batch;
  while (true) {
    bool may_begin = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (begun.empty() && !ended && failed.ok()) {
        cv_.wait(lock, [&] { return stop_ || (credits_ > 0 && unsent_ < max_unsent_); });
      }
      if (stop_ && !draining_) break;  // cancelled: nothing more is sent
      may_begin = !stop_ && !ended && failed.ok() && credits_ > begun.size() && unsent_ + begun.size() < max_unsent_ &&
                  begun.size() < depth;
    }
    if (may_begin) {
      // The batch is assembled straight into where it travels from, as its transport says.
      // (Two captures: the callback fits std::function's inline storage, no allocation.)
      std::pair<uint64_t, std::unique_ptr<Transport::Destination>> begin{serial, nullptr};
      auto more = loader_->Begin([this, &begin](uint64_t size) -> absl::StatusOr<absl::Span<std::byte>> {
        auto d = transport_->Reserve(begin.first, size);
        if (!d.ok()) return d.status();
        begin.second = std::move(*d);
        return begin.second->bytes;
      });
      std::unique_ptr<Transport::Destination> b = std::move(begin.second);
      if (!more.ok()) {
        // A drain cancels the loader: the batches begun are still sent. Otherwise the error
        // ends the stream after them.
        if (!absl::IsCancelled(more.status())) failed = more.status();
        else ended = true;
      } else if (!*more) {
        ended = true;
      } else if (b == nullptr) {  // the loader always asks where a batch it begins goes
        failed = absl::InternalError(absl::StrCat("batch ", serial, " was begun without a destination"));
      } else {
        begun.push_back(std::move(b));
        ++serial;
        continue;  // begin another while this one is assembled, if credits allow
      }
    }
    if (begun.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ && !draining_) break;
      if (!failed.ok()) {
        final_status_ = ToGrpc(failed);
        break;  // (logged below, outside the lock)
      }
      if (draining_) break;
      if (ended) {
        v1::StreamResponse end;
        end.mutable_end()->set_cursor(last_cursor_);
        end.mutable_end()->set_batches(next_serial_);
        queue_.push_back(OutgoingMessage{std::move(end), nullptr, 0, 0, nullptr});
        end_queued_ = true;
        break;
      }
      continue;  // waits for a credit
    }
    absl::Status done = loader_->Complete(&batch);
    if (!done.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        final_status_ = ToGrpc(done);
      }
      failed = done;  // (logged below, outside the lock)
      break;
    }
    std::unique_ptr<Transport::Destination> b = std::move(begun.front());
    begun.pop_front();
    if (!Publish(batch, std::move(b))) break;
  }
  if (!failed.ok()) LogStreamFailure(subscribe_.dataset(), failed);
}

bool StreamReactor::Publish(const Batch& batch, std::unique_ptr<Transport::Destination> destination) {
  const std::string cursor = resolved_.Encode(batch.after);
  const uint64_t serial = destination->serial;
  const uint64_t total = batch.plan.total_bytes;
  std::vector<OutgoingMessage> out;
  transport_->Describe(std::move(destination), BatchResponse(batch, serial, cursor, subscribe_.compact_pieces()), &out);
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ && !draining_) return false;  // cancelled while making it
  --credits_;
  ++next_serial_;
  outstanding_.insert(serial);
  if (Metrics* m = service_->options_.metrics) {
    m->Served(dataset_->config().name, transport_->name(), total, batch.plan.num_samples);
    m->InFlight(1);
    const double parsed = loader_->pipeline().parse_seconds();
    m->Parsed(dataset_->config().name, parsed - parse_seconds_reported_);
    parse_seconds_reported_ = parsed;
    m->Occupancy(dataset_->config().name, dataset_->resident_chunks(), dataset_->resident_bytes(),
                 service_->pool_->queued(), service_->pool_->busy());
    m->ChunkParses(dataset_->config().name, dataset_->parses());
  }
  last_cursor_ = cursor;
  if (!out.empty()) {
    out.back().ends_batch = true;
    ++unsent_;
  }
  for (auto& o : out) queue_.push_back(std::move(o));
  Pump();
  return true;
}

}  // namespace conveyor
