#include "common/batch/value_conversion.h"

#include <algorithm>

namespace conveyor {
namespace {

uint64_t AlignUp(uint64_t x) { return (x + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment; }

// Every array of a plan in the order PlanBatch places them.
template <typename Plan, typename F>
void ForEachArray(Plan& plan, F f) {
  f(plan.mask, false);
  f(plan.flags, false);
  for (auto& L : plan.streams) {
    f(L.lengths, false);
    f(L.rowptr, false);
    f(L.colind, false);
    f(L.colptr, false);
    f(L.rowind, false);
    f(L.values, !L.ids());
  }
}

}  // namespace

bool NarrowsValues(const BatchPlan& plan) {
  for (const StreamLayout& L : plan.streams) {
    if (L.values.dtype == DType::kFloat16 || L.values.dtype == DType::kBFloat16) return true;
  }
  return false;
}

BatchPlan WidePlan(const BatchPlan& plan) {
  BatchPlan wide = plan;
  uint64_t cursor = 0;
  ForEachArray(wide, [&](ArrayDesc& a, bool values) {
    if (!a.present()) return;
    if (values && (a.dtype == DType::kFloat16 || a.dtype == DType::kBFloat16)) {
      a.bytes = a.bytes / 2 * 4;
      a.dtype = DType::kFloat32;
    }
    a.offset = AlignUp(cursor);
    cursor = a.offset + a.bytes;
  });
  wide.total_bytes = AlignUp(cursor);
  return wide;
}

std::vector<NarrowOp> NarrowOps(const BatchPlan& wide, const BatchPlan& plan) {
  std::vector<const ArrayDesc*> from, to;
  ForEachArray(wide, [&](const ArrayDesc& a, bool) { from.push_back(&a); });
  ForEachArray(plan, [&](const ArrayDesc& a, bool) { to.push_back(&a); });
  std::vector<NarrowOp> ops;
  for (size_t k = 0; k < to.size(); ++k) {
    const ArrayDesc& a = *to[k];
    if (!a.present() || a.bytes == 0) continue;
    NarrowOp op;
    op.src = from[k]->offset;
    op.dst = a.offset;
    uint64_t elements = a.bytes, src_step = 1, dst_step = 1;
    if (a.dtype == DType::kFloat16 || a.dtype == DType::kBFloat16) {
      op.kind = static_cast<uint32_t>(a.dtype == DType::kFloat16 ? NarrowKind::kToFloat16 : NarrowKind::kToBFloat16);
      elements = a.bytes / 2;
      src_step = 4;
      dst_step = 2;
    }
    for (uint64_t done = 0; done < elements; done += kNarrowOpElements) {
      NarrowOp part = op;
      part.src += done * src_step;
      part.dst += done * dst_step;
      part.count = std::min(kNarrowOpElements, elements - done);
      ops.push_back(part);
    }
  }
  return ops;
}

}  // namespace conveyor
