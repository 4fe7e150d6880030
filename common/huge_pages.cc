#include "common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace conveyor {
namespace {

size_t WholePages(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

// A kept block serves a request of `need` bytes when it is at most this much larger: arrays
// of one dataset come in a few sizes (a chunk's), and a much larger block would hold memory
// the array does not use.
size_t LargestFit(size_t need) { return need + need / 2 + kHugePageBytes; }

// Maps `size` bytes (whole huge pages) on a 2 MiB boundary; nullptr when the system refuses.
void* MapAligned(size_t size) {
  const size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + span, used_end = aligned + size;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
#ifdef MADV_HUGEPAGE
  // A kernel without THP (EINVAL) maps it with small pages: nothing to do about it.
  if (HugePagesEnabled()) (void)madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);
}

class BlockCache {
 public:
  void* Allocate(size_t bytes) {
    const size_t need = WholePages(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = kept_.lower_bound(need);
      if (it != kept_.end() && it->first <= LargestFit(need)) {
        const size_t size = it->first;
        void* block = it->second;
        kept_.erase(it);
        stats_.kept -= size;
        ++stats_.reuses;
        in_use_[block] = size;
        return block;
      }
    }
    void* block = MapAligned(need);
    if (block == nullptr) {
      ReleaseAll();  // the kept blocks first, then once more
      block = MapAligned(need);
      if (block == nullptr) throw std::bad_alloc();
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_use_[block] = need;
    stats_.mapped += need;
    ++stats_.maps;
    return block;
  }

  void Free(void* block) {
    std::vector<std::pair<void*, size_t>> unmap;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_use_.find(block);
      if (it == in_use_.end()) return;  // not ours: cannot happen through HugePageAllocator
      const size_t size = it->second;
      in_use_.erase(it);
      kept_.emplace(size, block);
      stats_.kept += size;
      // Over the cap: the largest blocks go first (they are the likeliest to be odd sizes).
      while (stats_.kept > limit_ && !kept_.empty()) {
        auto largest = std::prev(kept_.end());
        unmap.emplace_back(largest->second, largest->first);
        stats_.kept -= largest->first;
        stats_.mapped -= largest->first;
        kept_.erase(largest);
      }
    }
    for (const auto& [p, size] : unmap) munmap(p, size);
  }

  uint64_t ReleaseAll() {
    std::multimap<size_t, void*> kept;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept.swap(kept_);
      stats_.mapped -= stats_.kept;
      stats_.kept = 0;
    }
    uint64_t released = 0;
    for (const auto& [size, p] : kept) {
      munmap(p, size);
      released += size;
    }
    return released;
  }

  HugeBlockStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  const uint64_t limit_ = HugeBlockCacheLimit();
  std::mutex mu_;
  std::multimap<size_t, void*> kept_;         // freed blocks by size
  std::unordered_map<void*, size_t> in_use_;  // block -> its mapped size
  HugeBlockStats stats_;
};

// Never destroyed: arrays freed during static destruction still find it.
BlockCache& Cache() {
  static BlockCache* cache = new BlockCache();
  return *cache;
}

}  // namespace

bool HugePagesEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CONVEYOR_HUGE_PAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

uint64_t HugeBlockCacheLimit() {
  if (const char* v = std::getenv("CONVEYOR_HUGE_BLOCK_CACHE_MB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0') return std::min<uint64_t>(mb, uint64_t{1} << 40) << 20;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const uint64_t physical = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  return std::min<uint64_t>(physical / 8, uint64_t{4} << 30);
}

void* AllocateHugeBlock(size_t bytes) { return Cache().Allocate(bytes); }
void FreeHugeBlock(void* block, size_t) { Cache().Free(block); }
uint64_t ReleaseHugeBlocks() { return Cache().ReleaseAll(); }
HugeBlockStats GetHugeBlockStats() { return Cache().Stats(); }

}  // namespace conveyor
