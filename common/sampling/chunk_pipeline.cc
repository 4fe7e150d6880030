#include "common/sampling/chunk_pipeline.h"

#include <algorithm>
#include <chrono>

namespace conveyor {

ChunkPipeline::ChunkPipeline(const Dataset* dataset, const ChunkPipelineOptions& options)
    : dataset_(dataset), options_(options) {
  if (options_.pool == nullptr) own_pool_ = std::make_unique<ParserPool>(std::max(1, options_.threads));
  pool_ = options_.pool != nullptr ? options_.pool : own_pool_.get();
}

ChunkPipeline::~ChunkPipeline() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    // Jobs still queued in the pool run and return at once; running ones finish their chunk.
    idle_cv_.wait(lock, [&] { return jobs_ == 0; });
  }
  own_pool_.reset();
}

void ChunkPipeline::Schedule() {
  const uint64_t budget = static_cast<uint64_t>(std::max(1, options_.threads));
  const uint64_t prefetch = static_cast<uint64_t>(std::max(1, options_.prefetch));
  while (!stop_ && jobs_ < budget && unstarted_ > unclaimed_ && ahead_ + unclaimed_ < prefetch) {
    ++jobs_;
    ++unclaimed_;
    pool_->Submit([this] { RunJob(); });
  }
}

uint64_t ChunkPipeline::Enqueue(uint64_t chunk_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  Entry& e = entries_[ticket];
  e.chunk = chunk_id;
  if (auto it = kept_.find(chunk_id); it != kept_.end()) {
    e.started = e.done = true;
    e.data = it->second;
    return ticket;
  }
  ++unstarted_;
  Schedule();
  return ticket;
}

void ChunkPipeline::RunJob() {
  std::unique_lock<std::mutex> lock(mu_);
  --unclaimed_;
  Entry* todo = nullptr;
  uint64_t ticket = 0;
  if (!stop_ && ahead_ < static_cast<uint64_t>(std::max(1, options_.prefetch))) {
    for (auto& [t, e] : entries_) {
      if (!e.started) {
        todo = &e;
        ticket = t;
        break;
      }
    }
  }
  if (todo != nullptr) {
    todo->started = true;
    todo->counted = true;
    --unstarted_;
    ++ahead_;
    const uint64_t chunk = todo->chunk;
    lock.unlock();
    dataset_->WillNeed(chunk);
    const auto t0 = std::chrono::steady_clock::now();
    auto parsed = dataset_->SharedChunk(chunk);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    parse_seconds_ += secs;
    ++chunks_parsed_;
    if (auto found = entries_.find(ticket); found != entries_.end()) {  // else released while parsed
      Entry& e = found->second;
      e.done = true;
      if (parsed.ok()) {
        e.data = std::move(*parsed);
        if (options_.keep_all) kept_[chunk] = e.data;
      } else {
        e.status = parsed.status();
      }
      done_cv_.notify_all();
    }
  }
  --jobs_;
  Schedule();
  idle_cv_.notify_all();
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> ChunkPipeline::Get(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return absl::InternalError("unknown chunk ticket");
  done_cv_.wait(lock, [&] { return it->second.done || cancelled_; });
  if (cancelled_) return absl::CancelledError("the stream was cancelled");
  if (!it->second.taken) {
    it->second.taken = true;
    if (it->second.counted) {  // a job may now run one chunk further ahead
      --ahead_;
      Schedule();
    }
  }
  if (!it->second.status.ok()) return it->second.status;
  return it->second.data;
}

void ChunkPipeline::Release(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  if (!it->second.started) --unstarted_;
  if (it->second.counted && !it->second.taken) --ahead_;
  entries_.erase(it);
  Schedule();
}

void ChunkPipeline::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  stop_ = true;  // no further parse jobs start; the destructor still waits for running ones
  done_cv_.notify_all();
}

uint64_t ChunkPipeline::chunks_parsed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_parsed_;
}

double ChunkPipeline::parse_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parse_seconds_;
}

}  // namespace conveyor
