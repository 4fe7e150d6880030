// huge_pages.h: the memory of a loader's large arrays, in 2 MiB pages kept for reuse.
//
// A loader's big arrays (parsed chunks' values, indices and tables; a sweep's randomized
// order) are written once into memory the process has not touched before whenever they
// outgrow what it holds: every sweep of a randomized read whose window keeps all chunks
// parsed at once, or the first epoch of any read. With 4 KiB pages each page is one fault;
// on the virtual machines measured in bench/RESULTS.md ("Huge pages") a fault costs several
// microseconds, and a 268 MB sparse CTF read spent more CPU in faults than in parsing.
//
// So arrays of kHugeBlockMinBytes or more come from blocks mapped on 2 MiB boundaries and
// advised for transparent huge pages (madvise(MADV_HUGEPAGE): one fault per 2 MiB where the
// kernel allows it), and a freed block is kept, its pages still backed, for the next array
// of about its size (up to a cap), instead of going back to the allocator: glibc would hand
// that memory out again partly discarded, where the kernel backs it with 4 KiB pages once
// more. Whether huge pages are used is the kernel's choice (/sys/kernel/mm/
// transparent_hugepage/enabled: `always` and `madvise` follow the advice, `never` ignores
// it); blocks are reused either way. CONVEYOR_HUGE_PAGES=0 in the environment turns the
// advice off (docs/operations.md says when to).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace conveyor {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
// Smallest array given a block of its own: below it, the rounding up to whole 2 MiB pages
// would waste more than it saves.
inline constexpr size_t kHugeBlockMinBytes = size_t{1} << 20;

// A block of at least `bytes` (rounded up to whole 2 MiB pages), 2 MiB aligned: a kept one
// of about that size, else a new mapping. Throws std::bad_alloc when the system has no
// memory to map. Under AddressSanitizer (decided where this is compiled, so every caller
// agrees) it is plain operator new, where ASan sees the bounds: blocks of our own would hide
// overruns inside them, and the fuzzers rely on ASan. Thread-safe.
void* AllocateHugeBlock(size_t bytes);
// Gives back a block from AllocateHugeBlock(`bytes` as asked for): kept for reuse while the
// blocks kept stay under the cap, unmapped otherwise. Never throws. Thread-safe.
void FreeHugeBlock(void* block, size_t bytes) noexcept;
// The memory an array at `data` of `bytes` (its capacity) holds: its whole block when it
// is one (the rounding, or a larger kept block it reuses), else `bytes`. For memory budgets
// (ParsedChunk::MemoryBytes). Thread-safe.
uint64_t HeldBytes(const void* data, size_t bytes);
// Unmaps every block kept (the daemon calls it when a subscription ends, with malloc_trim).
// Returns the bytes unmapped. Thread-safe.
uint64_t ReleaseHugeBlocks();

struct HugeBlockStats {
  uint64_t mapped = 0;  // bytes of blocks mapped now, in use or kept
  uint64_t kept = 0;    // of those, bytes kept for reuse
  uint64_t maps = 0;    // blocks mapped so far (new memory)
  uint64_t reuses = 0;  // blocks handed out again so far
};
HugeBlockStats GetHugeBlockStats();

// Bytes of freed blocks kept at most: CONVEYOR_HUGE_BLOCK_CACHE_MB if set, else 1/8 of the
// memory the process may use (the machine's, or its cgroup's memory.max when lower), at most
// 4 GiB. Kept blocks are outside the daemon's budgets: conveyord gives them back when a
// subscription ends and after indexing at start-up (with malloc_trim).
uint64_t HugeBlockCacheLimit();

// Whether AllocateHugeBlock() hands out blocks of its own (false under AddressSanitizer).
bool HugeBlocksInUse();

// Whether blocks are advised for huge pages (CONVEYOR_HUGE_PAGES is not "0"; read once).
bool HugePagesEnabled();

// std::allocator for large arrays: kHugeBlockMinBytes or more from AllocateHugeBlock(),
// less from operator new. Stateless: all instances are equal, so containers using it move
// and swap freely.
//
// Numbers and pointers added without a value (resize(n), the count constructor) are left
// unwritten, not zeroed: the parsers size a chunk's arrays and then write every element (an
// HTK or Kaldi matrix decoded into place, a CBF chunk's tables), as do the radix sorts of a
// sweep's order, and zeroing them first was a fifth of an HTK read's CPU. Where zeros are
// meant, write them (resize(n, 0), or a fill). Other element types (structs) are value-initialized as by
// std::allocator.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(size_t n) {
    if (n > SIZE_MAX / 2 / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugeBlockMinBytes) return static_cast<T*>(::operator new(bytes));
    return static_cast<T*>(AllocateHugeBlock(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugeBlockMinBytes) {
      ::operator delete(p);
    } else {
      FreeHugeBlock(p, n * sizeof(T));
    }
  }

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    if constexpr (std::is_arithmetic_v<U> || std::is_pointer_v<U>) {
      ::new (static_cast<void*>(p)) U;  // default-initialized: left as it is
    } else {
      ::new (static_cast<void*>(p)) U();
    }
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept { return false; }
};

// The array type of parsed chunks and other large per-sweep tables.
template <typename T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

// Bytes left as they are (not zeroed: filled by a read), from the same blocks as HugeVector.
// Move-only.
class HugeBytes {
 public:
  HugeBytes() = default;
  explicit HugeBytes(size_t size) : data_(size ? HugePageAllocator<char>().allocate(size) : nullptr), size_(size) {}
  HugeBytes(HugeBytes&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr, o.size_ = 0; }
  HugeBytes& operator=(HugeBytes&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = o.data_, size_ = o.size_;
      o.data_ = nullptr, o.size_ = 0;
    }
    return *this;
  }
  HugeBytes(const HugeBytes&) = delete;
  HugeBytes& operator=(const HugeBytes&) = delete;
  ~HugeBytes() { Free(); }

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  // The memory held (HeldBytes), for budgets.
  uint64_t held() const { return data_ ? HeldBytes(data_, size_) : 0; }

 private:
  void Free() noexcept {
    if (data_) HugePageAllocator<char>().deallocate(data_, size_);
  }
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace conveyor
