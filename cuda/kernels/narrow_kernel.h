// narrow_kernel.h: the last step of a program whose batch narrows values to float16 or
// bfloat16 (common/batch/value_conversion.h): every array of the float32 twin, assembled in
// scratch memory, moved into the slot, narrowed values converted by NarrowElement (the
// function the CPU assembler calls). One block per op, threads over its elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/batch/value_conversion.h"
#include "cuda/kernels/grid.h"

namespace conveyor::gpu {

struct NarrowKernel {
  const NarrowOp* ops;
  uint64_t n;
  const std::byte* wide;
  std::byte* slot;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return BlockPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.block; i < n; i += g.grid_dim) {
      const NarrowOp op = ops[i];
      for (uint64_t k = g.thread; k < op.count; k += g.block_dim) NarrowElement(op, k, wide, slot);
    }
  }
};

}  // namespace conveyor::gpu
