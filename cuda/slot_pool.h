// slot_pool.h: fixed-size slots carved from one allocation made once: pinned host memory
// (cudaHostAlloc) for staging and host-side batches, device memory (cudaMalloc, never
// managed) for batches assembled on the GPU, or plain host memory (tests, CPU builds).
// A full pool is back-pressure: Acquire() waits for a Release() (or its timeout), it never
// allocates. One allocation per pool also means one CUDA IPC handle exports every slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace conveyor::gpu {

enum class MemoryKind { kHost, kPinned, kDevice };
const char* MemoryKindName(MemoryKind kind);

// One allocation of `bytes` of `kind` (device memory on `device`), 256-byte aligned.
// Errors: Unimplemented (pinned/device without the CUDA backend), ResourceExhausted.
absl::StatusOr<void*> AllocateMemory(MemoryKind kind, uint64_t bytes, int device);
void FreeMemory(MemoryKind kind, void* ptr, int device);
// Copies between any two of host, pinned and device memory (cudaMemcpyDefault; a plain
// memcpy without the CUDA backend). Synchronous: complete, on the device too, when it
// returns, so work on any stream enqueued afterwards sees the bytes.
absl::Status CopyMemory(void* dst, const void* src, uint64_t bytes);

struct Slot {
  uint32_t index = 0;
  std::byte* data = nullptr;
  uint64_t bytes = 0;
};

class SlotPool {
 public:
  // `slots` slots of `slot_bytes` (rounded up to 256) each. Errors: InvalidArgument (zero
  // sizes, a total past 2^40 bytes), those of AllocateMemory.
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(MemoryKind kind, uint64_t slot_bytes, uint32_t slots,
                                                          int device = 0);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // A free slot, waiting up to `timeout` for one. Errors: DeadlineExceeded (every slot
  // still held: the consumers are behind), Cancelled (the pool was closed).
  absl::StatusOr<Slot> Acquire(absl::Duration timeout);
  // Returns a slot acquired before; releasing a free or unknown slot is an error.
  absl::Status Release(uint32_t index);
  // Wakes every waiter with Cancelled; later Acquire() calls fail the same way.
  void Close();

  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }
  std::byte* base() const { return base_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  uint32_t free_slots() const;

 private:
  SlotPool(MemoryKind kind, int device, std::byte* base, uint64_t slot_bytes, uint32_t slots);

  const MemoryKind kind_;
  const int device_;
  std::byte* const base_;
  const uint64_t slot_bytes_;
  const uint32_t slots_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // a stack: the most recently used slot first
  std::vector<bool> held_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace conveyor::gpu
