// value_conversion.h: how both assemblers deliver values narrowed to float16 or bfloat16
// (PlanBatch's `value_dtypes`). A batch whose plan narrows some stream is assembled in two
// steps: its float32 twin (WidePlan: the same arrays in the same order, values float32) is
// assembled as any batch is, then NarrowOps move every array of the twin into the plan's
// layout, converting narrowed values with half.h on the way (sums of a sparse stream
// delivered dense are thus made in float32 and rounded once). The CPU assembler runs the ops
// in a loop; the CUDA assembler runs them as a kernel whose body calls NarrowElement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/batch/batch_plan.h"
#include "common/batch/half.h"

namespace conveyor {

// True when some stream's values are float16 or bfloat16.
bool NarrowsValues(const BatchPlan& plan);

// `plan` with every stream's values float32 and the arrays placed again (offsets, sizes,
// total_bytes); everything else the same.
BatchPlan WidePlan(const BatchPlan& plan);

enum class NarrowKind : uint32_t { kCopy = 0, kToFloat16 = 1, kToBFloat16 = 2 };

// Moves one array of the wide batch into the narrow one: `count` bytes (kCopy) or float32
// elements (the others), from offset `src` of the wide batch to offset `dst` of the batch.
struct NarrowOp {
  uint64_t src = 0, dst = 0, count = 0;
  uint32_t kind = 0;
};

// Most bytes or elements one op moves; longer arrays become several ops (one GPU block each).
inline constexpr uint64_t kNarrowOpElements = 64 << 10;

// The ops that make `plan`'s batch from `wide` = WidePlan(plan)'s; gaps between arrays are
// not written (the assemblers zero them).
std::vector<NarrowOp> NarrowOps(const BatchPlan& wide, const BatchPlan& plan);

// Element (or byte) `i` of `op`.
inline CONVEYOR_HALF_HD void NarrowElement(const NarrowOp& op, uint64_t i, const std::byte* wide, std::byte* out) {
  if (op.kind == static_cast<uint32_t>(NarrowKind::kCopy)) {
    out[op.dst + i] = wide[op.src + i];
    return;
  }
  float v;
  memcpy(&v, wide + op.src + 4 * i, sizeof(v));
  const uint16_t h = op.kind == static_cast<uint32_t>(NarrowKind::kToFloat16) ? FloatToHalfBits(v) : FloatToBFloat16Bits(v);
  memcpy(out + op.dst + 2 * i, &h, sizeof(h));
}

}  // namespace conveyor
