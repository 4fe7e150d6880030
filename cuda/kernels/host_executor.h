// host_executor.h: runs a kernel body (grid.h) on the CPU over its whole launch, so that the
// code the device runs is what the host tests run (CI has no GPU). Two kinds of kernel:
//
//   - a plain kernel: `void operator()(const Grid&) const`, no barrier inside. Every
//     (block, thread) of the launch is called once, one after another. A plain kernel whose
//     threads depend on each other's writes within the launch is racy on the device; running
//     the threads forwards and backwards (ThreadOrder) makes most such races show here.
//   - a phased kernel, for a body with __syncthreads(): `K::kPhases` phases, block-shared
//     memory `K::Shared` (trivial), `uint64_t steps() const` block-uniform steps (step s is
//     done by block s % grid_dim, in a grid-stride loop), and
//     `void operator()(int phase, uint64_t step, const Grid&, K::Shared&) const`. The device
//     wrapper runs, per step, each phase followed by __syncthreads(); here every thread of the
//     block runs phase p before any runs phase p + 1. Shared memory starts as 0xFF bytes
//     (NaN floats), so a read of an entry no thread wrote shows.
//
// Header-only, no CUDA; the kernels run sequentially on the calling thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "cuda/kernels/grid.h"

namespace conveyor::gpu {

enum class ThreadOrder {
  kForward,  // blocks and threads in increasing order
  kReverse,  // both in decreasing order
};

// The host executor's choices: the launch policy (as the device's by default) and the order.
struct HostLaunch {
  LaunchPolicy policy = kDeviceLaunchPolicy;
  ThreadOrder order = ThreadOrder::kForward;
};

namespace host_executor_internal {
inline uint32_t Nth(uint32_t i, uint32_t n, ThreadOrder order) {
  return order == ThreadOrder::kForward ? i : n - 1 - i;
}
}  // namespace host_executor_internal

template <typename K>
void RunOnHost(const K& kernel, LaunchShape shape, ThreadOrder order = ThreadOrder::kForward) {
  using host_executor_internal::Nth;
  for (uint32_t i = 0; i < shape.blocks; ++i) {
    const uint32_t block = Nth(i, shape.blocks, order);
    for (uint32_t j = 0; j < shape.threads; ++j) {
      kernel(Grid{block, Nth(j, shape.threads, order), shape.threads, shape.blocks});
    }
  }
}

template <typename K>
void RunPhasedOnHost(const K& kernel, LaunchShape shape, ThreadOrder order = ThreadOrder::kForward) {
  using host_executor_internal::Nth;
  auto shared = std::make_unique<typename K::Shared>();
  const uint64_t steps = kernel.steps();
  for (uint32_t i = 0; i < shape.blocks; ++i) {
    const uint32_t block = Nth(i, shape.blocks, order);
    std::memset(static_cast<void*>(shared.get()), 0xFF, sizeof(typename K::Shared));
    for (uint64_t step = block; step < steps; step += shape.blocks) {
      for (int phase = 0; phase < K::kPhases; ++phase) {
        for (uint32_t j = 0; j < shape.threads; ++j) {
          kernel(phase, step, Grid{block, Nth(j, shape.threads, order), shape.threads, shape.blocks}, *shared);
        }
      }
    }
  }
}

}  // namespace conveyor::gpu
