// device_cases.h: a set of generated batches (the standard cases by default), planned, with
// the CPU assembler's bytes and a slot each of a given memory kind, for the GPU tests that
// enqueue many batches before looking at any. Header-only.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/batch/assembler.h"
#include "cuda/cases/batch_cases.h"
#include "cuda/slot_pool.h"
#include "gtest/gtest.h"

namespace conveyor::testing {

struct DeviceCases {
  std::vector<CaseSpec> cases;
  std::vector<BatchCase> batches;
  std::vector<BatchPlan> plans;
  std::vector<std::vector<std::byte>> want;
  std::unique_ptr<gpu::SlotPool> pool;
  std::vector<gpu::Slot> slots;

  // Case i made with seed `seed + i`; slots of `kind`.
  explicit DeviceCases(uint64_t seed, gpu::MemoryKind kind = gpu::MemoryKind::kDevice,
                       std::vector<CaseSpec> specs = StandardCases())
      : cases(std::move(specs)) {
    auto cpu = MakeCpuAssembler();
    uint64_t largest = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      batches.push_back(MakeBatchCase(cases[i], seed + i));
      const auto& c = batches.back();
      auto plan = PlanBatch(c.streams, cases[i].precision, c.shape, c.pieces, c.layouts);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (!plan.ok()) return;
      largest = std::max(largest, plan->total_bytes);
      want.emplace_back(plan->total_bytes);
      EXPECT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(want.back())).ok());
      plans.push_back(std::move(*plan));
    }
    auto made = gpu::SlotPool::Create(kind, largest, static_cast<uint32_t>(plans.size()));
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return;
    pool = std::move(*made);
    for (size_t i = 0; i < plans.size(); ++i) {
      auto slot = pool->Acquire(absl::ZeroDuration());
      EXPECT_TRUE(slot.ok()) << slot.status();
      if (slot.ok()) slots.push_back(*slot);
    }
  }
  bool ready() const { return plans.size() == cases.size() && slots.size() == plans.size(); }
  absl::Span<std::byte> slot(size_t i) const { return absl::MakeSpan(slots[i].data, plans[i].total_bytes); }
  // Case i's bytes in its slot equal the CPU's.
  void ExpectAssembled(size_t i) const {
    SCOPED_TRACE(cases[i].name);
    std::vector<std::byte> got(plans[i].total_bytes);
    ASSERT_TRUE(gpu::CopyMemory(got.data(), slots[i].data, got.size()).ok());
    size_t first = 0;
    while (first < got.size() && got[first] == want[i][first]) ++first;
    EXPECT_EQ(first, got.size()) << "first differing byte " << first << " of " << got.size();
  }
};

}  // namespace conveyor::testing
