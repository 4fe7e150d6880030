// chunk_cache.h: parsed chunks shared by every reader of one source of chunks (a Dataset, a
// chunked member of a composite): a chunk some reader still holds is not parsed again, and
// concurrent requests for one chunk parse it once (readers of different ranks, or several
// subscriptions to one stream, share the work). Nothing is kept once no reader holds it,
// unless SetRetainedBytes asks for the most recently used to be kept.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/parsed_chunk.h"

namespace conveyor {

class ChunkCache {
 public:
  using Parse = std::function<absl::StatusOr<std::unique_ptr<ParsedChunk>>(uint64_t chunk_id)>;
  using DoneWith = std::function<void(uint64_t chunk_id)>;
  // `parse` makes a chunk (called from readers' threads, without the cache's lock).
  // `done_with`, when set, tells the source a chunk's input pages are no longer needed: right
  // after parsing, or, for a chunk whose values point into the input (in place or
  // compressed), once its last reader lets go. It is not called after the cache is gone.
  ChunkCache(Parse parse, DoneWith done_with);
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The parsed chunk, shared. Thread-safe. Errors: those of `parse`. `parsed_here`, when
  // given, says whether this call parsed it (false: held already, or parsed by a concurrent
  // call).
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> Get(uint64_t chunk_id, bool* parsed_here = nullptr) const;

  // Keeps up to `bytes` of the most recently used chunks after their last reader lets go
  // (least recently used dropped first). 0 (the default): nothing is kept.
  void SetRetainedBytes(uint64_t bytes) const;
  // Drops retained chunks, least recently used first, until at least `bytes` are dropped or
  // none is left; returns the bytes dropped (a chunk a reader still holds stays resident).
  uint64_t DropRetained(uint64_t bytes) const;
  // Drops retained chunks no reader holds (the list's is their only reference), least
  // recently used first, until at least `bytes` are freed or none is left; returns the bytes
  // freed. What a parse that needs room asks for: dropping a chunk a reader holds frees nothing.
  uint64_t DropUnheld(uint64_t bytes) const;
  // Whether chunk `chunk_id` is in memory now (held by a reader or retained).
  bool Holds(uint64_t chunk_id) const;
  uint64_t retained_bytes() const;
  // Parsed chunks held by readers right now, and their heap bytes.
  uint64_t resident_chunks() const { return resident_->chunks.load(); }
  uint64_t resident_bytes() const { return resident_->bytes.load(); }

 private:
  struct CacheEntry {
    std::weak_ptr<const ParsedChunk> chunk;
    bool parsing = false;
  };
  // Recently used chunks held for readers to come (SetRetainedBytes), most recent first.
  struct Retained {
    uint64_t chunk_id, bytes;
    std::shared_ptr<const ParsedChunk> chunk;
  };
  struct Resident {  // shared with the chunks' deleters, which may outlive the cache
    std::atomic<uint64_t> chunks{0}, bytes{0};
    // Chunks that point into the input (dense values used in place) have their pages
    // dropped when they are released, not after parsing. Empty once the cache is gone.
    std::mutex mu;
    DoneWith done_with;
  };
  void RetainLocked(uint64_t chunk_id, const std::shared_ptr<const ParsedChunk>& chunk) const;
  // Drops retained chunks, least recent first, until `bytes` are dropped; returns them.
  std::vector<std::shared_ptr<const ParsedChunk>> DropLeastRecentLocked(uint64_t bytes) const;

  const Parse parse_;
  const DoneWith done_with_;
  mutable std::mutex cache_mu_;
  mutable std::condition_variable cache_cv_;
  mutable std::map<uint64_t, CacheEntry> cache_;
  mutable std::list<Retained> retained_;
  mutable uint64_t retained_bytes_ = 0, retain_limit_ = 0;
  std::shared_ptr<Resident> resident_ = std::make_shared<Resident>();
};

}  // namespace conveyor
