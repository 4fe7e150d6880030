#include "common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

// Under AddressSanitizer blocks are plain operator new (huge_pages.h says why). Decided here,
// in one translation unit, so that allocation and release always agree.
#if defined(__SANITIZE_ADDRESS__)
#define CONVEYOR_HUGE_BLOCKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONVEYOR_HUGE_BLOCKS 0
#endif
#endif
#ifndef CONVEYOR_HUGE_BLOCKS
#define CONVEYOR_HUGE_BLOCKS 1
#endif

namespace conveyor {
namespace {

size_t WholePages(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

// A kept block serves a request of `need` bytes when it is at most this much larger: arrays
// of one dataset come in a few sizes (a chunk's, reserved from the largest seen so far), and
// a larger block holds memory (backed pages) the array does not use.
size_t LargestFit(size_t need) { return need + need / 4 + kHugePageBytes; }

// Maps `size` bytes (whole huge pages) on a 2 MiB boundary; nullptr when the system refuses.
void* MapAligned(size_t size) {
  const size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t end = start + span, used_end = aligned + size;
  // Trimming splits the mapping; where the kernel refuses (the map count at its limit), the
  // whole span goes and the caller sees no memory.
  if ((aligned > start && munmap(raw, aligned - start) != 0) ||
      (end > used_end && munmap(reinterpret_cast<void*>(used_end), end - used_end) != 0)) {
    munmap(raw, span);
    return nullptr;
  }
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
      in_use_.reserve(in_use_.size() + 1);  // may throw: before anything changes
      auto it = kept_.lower_bound(need);
      if (it != kept_.end() && it->first <= LargestFit(need)) {
        const size_t size = it->first;
        void* block = it->second;
        kept_.erase(it);
        stats_.kept -= size;
        ++stats_.reuses;
        in_use_.emplace(block, size);  // room reserved above: does not throw
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
    try {
      in_use_.emplace(block, need);
    } catch (...) {
      munmap(block, need);
      throw;
    }
    stats_.mapped += need;
    ++stats_.maps;
    return block;
  }

  // Unmaps under the lock what does not stay (no allocation here: it must not throw).
  void Free(void* block) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.find(block);
    if (it == in_use_.end()) return;  // not ours: cannot happen through HugePageAllocator
    const size_t size = it->second;
    in_use_.erase(it);
    bool kept = false;
    if (size <= limit_) {
      try {
        kept_.emplace(size, block);
        stats_.kept += size;
        kept = true;
      } catch (...) {  // no memory for the list's node: the block goes instead
      }
    }
    if (!kept) {
      munmap(block, size);
      stats_.mapped -= size;
      return;
    }
    // Over the cap: the largest blocks go first (they are the likeliest to be odd sizes).
    while (stats_.kept > limit_ && !kept_.empty()) {
      auto largest = std::prev(kept_.end());
      munmap(largest->second, largest->first);
      stats_.kept -= largest->first;
      stats_.mapped -= largest->first;
      kept_.erase(largest);
    }
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

  uint64_t Held(const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.find(const_cast<void*>(data));
    return it == in_use_.end() ? bytes : it->second;
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

// The memory limit of this process's cgroup (v2 memory.max, else v1's limit), or 0 when none.
uint64_t CgroupLimit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string v;
    if (!(in >> v) || v == "max") continue;
    char* end = nullptr;
    const unsigned long long limit = std::strtoull(v.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && limit > 0 && limit < (uint64_t{1} << 60)) return limit;
  }
  return 0;
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
    // Digits only: strtoull alone would take "-1" for 2^64 - 1 (no cap at all).
    char* end = nullptr;
    errno = 0;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (v[0] >= '0' && v[0] <= '9' && end != nullptr && *end == '\0' && errno == 0) {
      return std::min<uint64_t>(mb, uint64_t{1} << 40) << 20;
    }
    static std::once_flag warned;
    std::call_once(warned, [v] {
      std::fprintf(stderr,
                   "WARNING: CONVEYOR_HUGE_BLOCK_CACHE_MB=%s is not a number of MiB (0 or more); the default cap "
                   "is used\n",
                   v);
    });
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  if (const uint64_t cgroup = CgroupLimit(); cgroup > 0 && (memory == 0 || cgroup < memory)) memory = cgroup;
  return std::min<uint64_t>(memory / 8, uint64_t{4} << 30);
}

void* AllocateHugeBlock(size_t bytes) {
  if (!CONVEYOR_HUGE_BLOCKS) return ::operator new(bytes);
  return Cache().Allocate(bytes);
}

void FreeHugeBlock(void* block, size_t) noexcept {
  if (!CONVEYOR_HUGE_BLOCKS) {
    ::operator delete(block);
    return;
  }
  Cache().Free(block);
}

uint64_t HeldBytes(const void* data, size_t bytes) {
  if (!CONVEYOR_HUGE_BLOCKS || data == nullptr || bytes < kHugeBlockMinBytes) return bytes;
  return Cache().Held(data, bytes);
}

bool HugeBlocksInUse() { return CONVEYOR_HUGE_BLOCKS; }

uint64_t ReleaseHugeBlocks() { return CONVEYOR_HUGE_BLOCKS ? Cache().ReleaseAll() : 0; }
HugeBlockStats GetHugeBlockStats() { return CONVEYOR_HUGE_BLOCKS ? Cache().Stats() : HugeBlockStats{}; }

}  // namespace conveyor
