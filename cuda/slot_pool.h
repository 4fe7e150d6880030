// slot_pool.h: fixed-size slots carved from one allocation made once: pinned host memory
// (cudaHostAlloc) for staging and host-side batches, device memory (cudaMalloc, never
// managed) for batches assembled on the GPU, or plain host memory (tests, CPU builds).
// A full pool is back-pressure: Acquire() waits for a Release() (or its timeout), it never
// allocates. One allocation per pool also means one CUDA IPC handle exports every slot.
// A pool may also be laid over memory made elsewhere (a memfd segment, an exported device
// block): SlotPool::Over() keeps that memory's owner alive instead of allocating.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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

// Host memory made elsewhere (a memfd segment, an mmap) page-locked for DMA by every device
// (cudaHostRegister, portable), so that a device copies into it asynchronously; unlocked when
// destroyed, which must happen before the memory is unmapped.
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 protected:
  HostRegistration() = default;
};
// Registers [data, data + bytes) with `device` current. Errors: Unimplemented (no CUDA
// backend), FailedPrecondition (no such device), ResourceExhausted (the driver refused: out
// of lockable memory, or memory of a kind it cannot lock), InvalidArgument (empty range).
absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHostMemory(void* data, uint64_t bytes, int device);
// Whether [data, data + bytes) is page-locked host memory a device writes by DMA (both ends
// are: cudaHostAlloc'd or registered; the runtime says "unregistered" of pageable memory).
// False without the CUDA backend or a device, and for an empty range.
bool IsPageLocked(const void* data, uint64_t bytes);

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
  // `slots` slots of `slot_bytes` each over memory of `kind` that `memory` owns (at least
  // slots x slot_bytes bytes at memory.get()); the pool holds its reference until destroyed
  // and frees nothing itself. Errors: InvalidArgument (null memory, zero sizes, slot_bytes
  // not a multiple of 256, which would misalign the arrays of every slot but the first).
  static absl::StatusOr<std::unique_ptr<SlotPool>> Over(MemoryKind kind, std::shared_ptr<std::byte> memory,
                                                        uint64_t slot_bytes, uint32_t slots, int device = 0);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // A free slot, waiting up to `timeout` for one. Errors: DeadlineExceeded (every slot
  // still held: the consumers are behind), Cancelled (the pool was closed).
  absl::StatusOr<Slot> Acquire(absl::Duration timeout);
  // A free slot if there is one, without waiting; nullopt when every slot is held or the
  // pool is closed.
  std::optional<Slot> TryAcquire();
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
  SlotPool(MemoryKind kind, int device, std::byte* base, uint64_t slot_bytes, uint32_t slots,
           std::shared_ptr<std::byte> owner = nullptr);

  const MemoryKind kind_;
  const int device_;
  std::byte* const base_;
  const uint64_t slot_bytes_;
  const uint32_t slots_;
  const std::shared_ptr<std::byte> owner_;  // Over(): the memory's owner; else null (the pool frees base_)
  mutable absl::Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // a stack: the most recently used slot first
  std::vector<bool> held_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace conveyor::gpu
