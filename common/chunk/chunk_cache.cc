#include "common/chunk/chunk_cache.h"

#include <utility>

namespace conveyor {

ChunkCache::ChunkCache(Parse parse, DoneWith done_with) : parse_(std::move(parse)), done_with_(std::move(done_with)) {
  resident_->done_with = done_with_;
}

ChunkCache::~ChunkCache() {
  std::lock_guard<std::mutex> lock(resident_->mu);
  resident_->done_with = nullptr;
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> ChunkCache::Get(uint64_t chunk_id, bool* parsed_here) const {
  if (parsed_here != nullptr) *parsed_here = false;
  std::unique_lock<std::mutex> lock(cache_mu_);
  while (true) {
    CacheEntry& e = cache_[chunk_id];
    if (auto live = e.chunk.lock()) {
      RetainLocked(chunk_id, live);
      return live;
    }
    if (!e.parsing) break;
    cache_cv_.wait(lock);  // another reader is parsing it
  }
  cache_[chunk_id].parsing = true;
  lock.unlock();
  if (parsed_here != nullptr) *parsed_here = true;
  auto parsed = parse_(chunk_id);
  // A chunk whose values are used where they lie in the mapping (CBF) keeps its pages
  // until it is released; any other chunk is done with them now.
  bool points_into_file = false;
  if (parsed.ok() && done_with_) {
    for (const ParsedStream& ps : (*parsed)->streams) points_into_file |= !ps.in_place.empty() || !ps.compressed.empty() || !ps.sparse_values_in_place.empty();
  }
  if (!points_into_file && done_with_) done_with_(chunk_id);
  lock.lock();
  CacheEntry& e = cache_[chunk_id];
  e.parsing = false;
  cache_cv_.notify_all();
  if (!parsed.ok()) return parsed.status();
  const uint64_t bytes = (*parsed)->MemoryBytes();
  resident_->chunks += 1;
  resident_->bytes += bytes;
  std::shared_ptr<const ParsedChunk> chunk((*parsed).release(), [resident = resident_, bytes, chunk_id,
                                                                  points_into_file](const ParsedChunk* c) {
    resident->chunks -= 1;
    resident->bytes -= bytes;
    delete c;
    if (points_into_file) {
      std::lock_guard<std::mutex> guard(resident->mu);
      if (resident->done_with) resident->done_with(chunk_id);
    }
  });
  e.chunk = chunk;
  RetainLocked(chunk_id, chunk);
  return chunk;
}

void ChunkCache::RetainLocked(uint64_t chunk_id, const std::shared_ptr<const ParsedChunk>& chunk) const {
  if (retain_limit_ == 0) return;
  for (auto it = retained_.begin(); it != retained_.end(); ++it) {  // a few entries: a scan is enough
    if (it->chunk_id == chunk_id) {
      retained_.splice(retained_.begin(), retained_, it);
      return;
    }
  }
  const uint64_t bytes = chunk->MemoryBytes();
  if (bytes > retain_limit_) return;
  retained_.push_front(Retained{chunk_id, bytes, chunk});
  retained_bytes_ += bytes;
  // Still held by the caller: dropping the least recent here frees nothing but older chunks,
  // which may be freed under the lock (their deleters take no lock of this cache).
  DropLeastRecentLocked(retained_bytes_ > retain_limit_ ? retained_bytes_ - retain_limit_ : 0);
}

std::vector<std::shared_ptr<const ParsedChunk>> ChunkCache::DropLeastRecentLocked(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> dropped;
  uint64_t freed = 0;
  while (freed < bytes && !retained_.empty()) {
    freed += retained_.back().bytes;
    retained_bytes_ -= retained_.back().bytes;
    dropped.push_back(std::move(retained_.back().chunk));
    retained_.pop_back();
  }
  return dropped;
}

void ChunkCache::SetRetainedBytes(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(cache_mu_);
  retain_limit_ = bytes;
  released = DropLeastRecentLocked(retained_bytes_ > bytes ? retained_bytes_ - bytes : 0);
}

uint64_t ChunkCache::DropRetained(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(cache_mu_);
  const uint64_t before = retained_bytes_;
  released = DropLeastRecentLocked(bytes);
  return before - retained_bytes_;
}

uint64_t ChunkCache::DropUnheld(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(cache_mu_);
  uint64_t freed = 0;
  // Least recent first. Under the lock a count of one is final: another reference can only
  // come from Get(), which takes the lock.
  for (auto it = retained_.end(); it != retained_.begin() && freed < bytes;) {
    --it;
    if (it->chunk.use_count() != 1) continue;
    freed += it->bytes;
    retained_bytes_ -= it->bytes;
    released.push_back(std::move(it->chunk));
    it = retained_.erase(it);
  }
  return freed;
}

bool ChunkCache::Holds(uint64_t chunk_id) const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = cache_.find(chunk_id);
  return it != cache_.end() && !it->second.chunk.expired();
}

uint64_t ChunkCache::retained_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return retained_bytes_;
}

}  // namespace conveyor
