#include "cuda/slot_pool.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace conveyor::gpu {

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinned: return "pinned";
    case MemoryKind::kDevice: return "device";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(MemoryKind kind, uint64_t slot_bytes, uint32_t slots,
                                                           int device) {
  if (slot_bytes == 0 || slots == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", MemoryKindName(kind), " slot pool needs slots (", slots,
                                                   ") of a nonzero size (", slot_bytes, " bytes)"));
  }
  slot_bytes = (slot_bytes + 255) / 256 * 256;
  if (slot_bytes > (uint64_t{1} << 40) / slots) {
    return absl::InvalidArgumentError(absl::StrCat("a ", MemoryKindName(kind), " slot pool of ", slots, " x ",
                                                   slot_bytes, " bytes exceeds 1 TiB"));
  }
  absl::StatusOr<void*> mem = AllocateMemory(kind, slot_bytes * slots, device);
  if (!mem.ok()) return mem.status();
  return std::unique_ptr<SlotPool>(new SlotPool(kind, device, static_cast<std::byte*>(*mem), slot_bytes, slots));
}

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Over(MemoryKind kind, std::shared_ptr<std::byte> memory,
                                                         uint64_t slot_bytes, uint32_t slots, int device) {
  if (memory == nullptr || slot_bytes == 0 || slots == 0 || slot_bytes % 256 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", MemoryKindName(kind), " slot pool over given memory needs that memory",
        memory == nullptr ? " (none was given)" : "", ", at least one slot (", slots,
        ") and slots of a nonzero multiple of 256 bytes (", slot_bytes, ")"));
  }
  std::byte* base = memory.get();
  return std::unique_ptr<SlotPool>(new SlotPool(kind, device, base, slot_bytes, slots, std::move(memory)));
}

SlotPool::SlotPool(MemoryKind kind, int device, std::byte* base, uint64_t slot_bytes, uint32_t slots,
                   std::shared_ptr<std::byte> owner)
    : kind_(kind), device_(device), base_(base), slot_bytes_(slot_bytes), slots_(slots), owner_(std::move(owner)),
      held_(slots, false) {
  for (uint32_t i = slots; i > 0; --i) free_.push_back(i - 1);
}

SlotPool::~SlotPool() {
  if (owner_ == nullptr) FreeMemory(kind_, base_, device_);
}

absl::StatusOr<Slot> SlotPool::Acquire(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || !free_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (closed_) return absl::CancelledError(absl::StrCat("the ", MemoryKindName(kind_), " slot pool is closed"));
  if (free_.empty()) {
    return absl::DeadlineExceededError(absl::StrCat("all ", slots_, " ", MemoryKindName(kind_),
                                                    " slots are still held after ", absl::FormatDuration(timeout),
                                                    " (consumers have not acknowledged them)"));
  }
  const uint32_t i = free_.back();
  free_.pop_back();
  held_[i] = true;
  return Slot{i, base_ + uint64_t{i} * slot_bytes_, slot_bytes_};
}

std::optional<Slot> SlotPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (closed_ || free_.empty()) return std::nullopt;
  const uint32_t i = free_.back();
  free_.pop_back();
  held_[i] = true;
  return Slot{i, base_ + uint64_t{i} * slot_bytes_, slot_bytes_};
}

absl::Status SlotPool::Release(uint32_t index) {
  absl::MutexLock lock(&mu_);
  if (index >= slots_ || !held_[index]) {
    return absl::FailedPreconditionError(absl::StrCat("slot ", index, " of the ", MemoryKindName(kind_),
                                                      " pool is not held (", slots_, " slots)"));
  }
  held_[index] = false;
  free_.push_back(index);
  return absl::OkStatus();
}

void SlotPool::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

uint32_t SlotPool::free_slots() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(free_.size());
}

}  // namespace conveyor::gpu
