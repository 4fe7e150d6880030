// Slot pools: back-pressure instead of allocation, release rules, closing; pinned and device
// pools where a device exists.
#include "cuda/slot_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if defined(CONVEYOR_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

TEST(SlotPool, HandsOutDistinctAlignedSlotsOfOneAllocation) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 1000, 3);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->slot_bytes(), 1024u);  // rounded up to 256
  std::vector<Slot> slots;
  for (int i = 0; i < 3; ++i) {
    auto s = (*pool)->Acquire(absl::ZeroDuration());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data) % 256, 0u);
    EXPECT_EQ(s->data, (*pool)->base() + uint64_t{s->index} * 1024);
    std::memset(s->data, i, s->bytes);  // the whole slot is ours
    slots.push_back(*s);
  }
  EXPECT_NE(slots[0].index, slots[1].index);
  EXPECT_NE(slots[1].index, slots[2].index);
  EXPECT_EQ((*pool)->free_slots(), 0u);
}

TEST(SlotPool, AFullPoolIsBackPressureNotAnAllocation) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 256, 1);
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(a.ok());
  auto b = (*pool)->Acquire(absl::Milliseconds(20));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(b.status().message().find("all 1 host slots are still held"), std::string::npos) << b.status();
  ASSERT_TRUE((*pool)->Release(a->index).ok());
  auto c = (*pool)->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->index, a->index);
}

TEST(SlotPool, AWaiterGetsTheSlotReleasedByAnotherThread) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 256, 1);
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(a.ok());
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE((*pool)->Release(a->index).ok());
  });
  auto b = (*pool)->Acquire(absl::Seconds(10));
  releaser.join();
  ASSERT_TRUE(b.ok()) << b.status();
}

TEST(SlotPool, ReleasingASlotNotHeldIsAnError) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 256, 2);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->Release(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*pool)->Release(7).code(), absl::StatusCode::kFailedPrecondition);
  auto a = (*pool)->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE((*pool)->Release(a->index).ok());
  EXPECT_EQ((*pool)->Release(a->index).code(), absl::StatusCode::kFailedPrecondition);  // twice
}

TEST(SlotPool, CloseWakesWaitersWithCancelled) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 256, 1);
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE((*pool)->Acquire(absl::ZeroDuration()).ok());
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(30));
    (*pool)->Close();
  });
  auto b = (*pool)->Acquire(absl::Seconds(30));
  closer.join();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kCancelled);
}

TEST(SlotPool, RefusesEmptyAndAbsurdSizes) {
  EXPECT_EQ(SlotPool::Create(MemoryKind::kHost, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SlotPool::Create(MemoryKind::kHost, 256, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SlotPool::Create(MemoryKind::kHost, uint64_t{1} << 40, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SlotPool, TryAcquireNeverWaits) {
  auto pool = SlotPool::Create(MemoryKind::kHost, 256, 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->TryAcquire();
  auto b = (*pool)->TryAcquire();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->index, 0u);  // slot 0 first, then 1: the order transports' offsets rely on
  EXPECT_EQ(b->index, 1u);
  EXPECT_FALSE((*pool)->TryAcquire().has_value());
  ASSERT_TRUE((*pool)->Release(a->index).ok());
  auto c = (*pool)->TryAcquire();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->index, 0u);  // the most recently released slot first
  ASSERT_TRUE((*pool)->Release(c->index).ok());
  (*pool)->Close();
  EXPECT_FALSE((*pool)->TryAcquire().has_value());
}

TEST(SlotPool, OverGivenMemoryKeepsItsOwnerAndFreesNothing) {
  bool freed = false;
  std::vector<std::byte> bytes(3 * 512 + 256);
  std::byte* base = bytes.data() + (256 - reinterpret_cast<uintptr_t>(bytes.data()) % 256) % 256;
  std::shared_ptr<std::byte> owner(base, [&freed](std::byte*) { freed = true; });
  {
    auto pool = SlotPool::Over(MemoryKind::kHost, owner, 512, 3);
    ASSERT_TRUE(pool.ok()) << pool.status();
    owner.reset();  // the pool holds the memory now
    EXPECT_FALSE(freed);
    EXPECT_EQ((*pool)->base(), base);
    auto s = (*pool)->Acquire(absl::ZeroDuration());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->data, base);
    EXPECT_EQ(s->bytes, 512u);
  }
  EXPECT_TRUE(freed);  // through the owner, once the pool is gone
}

TEST(SlotPool, OverRefusesMisalignedOrMissingMemory) {
  std::vector<std::byte> bytes(1024);
  std::shared_ptr<std::byte> owner(bytes.data(), [](std::byte*) {});
  EXPECT_EQ(SlotPool::Over(MemoryKind::kHost, owner, 300, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SlotPool::Over(MemoryKind::kHost, owner, 256, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SlotPool::Over(MemoryKind::kHost, nullptr, 256, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SlotPool, PinnedAndDevicePoolsNeedTheBackend) {
  if (CudaBuilt()) GTEST_SKIP() << "this build has the CUDA backend; see PinnedAndDevicePoolsAllocateOnce";
  EXPECT_EQ(SlotPool::Create(MemoryKind::kPinned, 256, 2).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(SlotPool::Create(MemoryKind::kDevice, 256, 2).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(SlotPoolGpu, PinnedAndDevicePoolsAllocateOnce) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  for (MemoryKind kind : {MemoryKind::kPinned, MemoryKind::kDevice}) {
    auto pool = SlotPool::Create(kind, 1 << 20, 4);
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::vector<Slot> held;
    for (int i = 0; i < 4; ++i) {
      auto s = (*pool)->Acquire(absl::ZeroDuration());
      ASSERT_TRUE(s.ok());
      held.push_back(*s);
    }
    EXPECT_EQ((*pool)->Acquire(absl::Milliseconds(5)).status().code(), absl::StatusCode::kDeadlineExceeded);
    for (const Slot& s : held) EXPECT_TRUE((*pool)->Release(s.index).ok());
  }
}

// Page-locking memory made elsewhere: refused with a reason where it cannot be done (no
// backend, no device), never a crash; the transports then fall back to the assembler's own
// pinned buffer.
TEST(HostRegistration, WithoutADeviceIsRefusedWithAReason) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "a CUDA device is present; see HostRegistrationGpu";
  std::vector<std::byte> memory(1 << 16);
  auto locked = RegisterHostMemory(memory.data(), memory.size(), 0);
  ASSERT_FALSE(locked.ok());
  EXPECT_EQ(locked.status().code(),
            CudaBuilt() ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kUnimplemented)
      << locked.status();
  EXPECT_FALSE(locked.status().message().empty());
  EXPECT_EQ(RegisterHostMemory(nullptr, 0, 0).status().code(),
            CudaBuilt() ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnimplemented);
}

// Registered memory is page-locked (a device writes it by DMA) until the registration goes;
// the same pages can be registered again after, and a mapping of shared memory (what the
// shm transport registers) is accepted too.
TEST(HostRegistrationGpu, LocksUntilDestroyedThenLocksAgain) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
#if defined(CONVEYOR_HAVE_CUDA)
  for (int flags : {MAP_PRIVATE | MAP_ANONYMOUS, MAP_SHARED | MAP_ANONYMOUS}) {
    const size_t bytes = 3 << 20;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    auto is_locked = [&] {
      cudaPointerAttributes attr{};
      EXPECT_EQ(cudaPointerGetAttributes(&attr, static_cast<char*>(p) + bytes - 1), cudaSuccess);
      return attr.type == cudaMemoryTypeHost;
    };
    EXPECT_FALSE(is_locked());
    for (int round = 0; round < 2; ++round) {
      auto locked = RegisterHostMemory(p, bytes, 0);
      ASSERT_TRUE(locked.ok()) << locked.status();
      EXPECT_TRUE(is_locked());
      locked->reset();
      EXPECT_FALSE(is_locked());
    }
    ::munmap(p, bytes);
  }
#endif
}

}  // namespace
}  // namespace conveyor::gpu
