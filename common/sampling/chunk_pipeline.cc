#include "common/sampling/chunk_pipeline.h"

#include <chrono>

namespace conveyor {

ChunkPipeline::ChunkPipeline(const Dataset* dataset, const ChunkPipelineOptions& options)
    : dataset_(dataset), options_(options) {
  const int n = std::max(1, options_.threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Worker(); });
}

ChunkPipeline::~ChunkPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
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
  work_cv_.notify_one();
  return ticket;
}

void ChunkPipeline::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    Entry* todo = nullptr;
    uint64_t ticket = 0;
    work_cv_.wait(lock, [&] {
      if (stop_) return true;
      if (ahead_ >= static_cast<uint64_t>(std::max(1, options_.prefetch))) return false;
      for (auto& [t, e] : entries_) {
        if (!e.started) {
          todo = &e;
          ticket = t;
          return true;
        }
      }
      return false;
    });
    if (stop_) return;
    todo->started = true;
    todo->counted = true;
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
    auto found = entries_.find(ticket);
    if (found == entries_.end()) continue;  // released while being parsed
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

absl::StatusOr<std::shared_ptr<const ParsedChunk>> ChunkPipeline::Get(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return absl::InternalError("unknown chunk ticket");
  done_cv_.wait(lock, [&] { return it->second.done; });
  if (!it->second.taken) {
    it->second.taken = true;
    if (it->second.counted) {  // a worker may now run one chunk further ahead
      --ahead_;
      work_cv_.notify_one();
    }
  }
  if (!it->second.status.ok()) return it->second.status;
  return it->second.data;
}

void ChunkPipeline::Release(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  if (it->second.counted && !it->second.taken) {
    --ahead_;
    work_cv_.notify_one();
  }
  entries_.erase(it);
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
