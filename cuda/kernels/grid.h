// grid.h: what a kernel body sees of its launch, so that one body runs on the device and,
// through the host executor (host_executor.h), on the CPU. A body is a `CONVEYOR_HD` function
// of a Grid (the coordinates CUDA's built-ins would give) instead of blockIdx/threadIdx; the
// `__global__` wrappers (device_launch.cuh) pass the built-ins, the host executor every
// coordinate of the launch in turn. Compiled by nvcc (device and host) and by g++/clang.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <vector_types.h>
#define CONVEYOR_HD __host__ __device__
#else
#define CONVEYOR_HD
#endif

namespace conveyor::gpu {

// One thread's place in its launch: blockIdx.x, threadIdx.x, blockDim.x, gridDim.x.
struct Grid {
  uint32_t block = 0, thread = 0, block_dim = 1, grid_dim = 1;

  // The thread's index over the whole grid, and the grid's thread count (the stride of a
  // grid-stride loop over per-thread work), both 64-bit so that loops never wrap.
  CONVEYOR_HD uint64_t global_thread() const { return uint64_t{block} * block_dim + thread; }
  CONVEYOR_HD uint64_t global_threads() const { return uint64_t{grid_dim} * block_dim; }
};

// A launch: `blocks` blocks of `threads` threads (one dimension).
struct LaunchShape {
  uint32_t blocks = 1, threads = 1;
};

// How launches are shaped: each kernel asks for as many blocks as it has work units (a
// block per item, or enough blocks for a thread per item), at most `max_blocks`, of
// `threads` threads. Every kernel loops (grid-stride) over what its grid does not cover, so
// any policy gives the same bytes; tests run odd ones (1 block, 1 thread, 37 threads).
struct LaunchPolicy {
  uint32_t max_blocks = 65535;
  uint32_t threads = 256;
};

// The policy the device uses (and the host executor by default).
inline constexpr LaunchPolicy kDeviceLaunchPolicy{};

inline LaunchShape BlockPerItem(uint64_t items, const LaunchPolicy& p) {
  const uint64_t blocks = items == 0 ? 1 : (items < p.max_blocks ? items : p.max_blocks);
  return {static_cast<uint32_t>(blocks), p.threads};
}

inline LaunchShape ThreadPerItem(uint64_t items, const LaunchPolicy& p) {
  return BlockPerItem((items + p.threads - 1) / p.threads, p);
}

// 16 bytes moved as one (a 128-bit load and store on the device).
#if defined(__CUDACC__)
using Bytes16 = uint4;
#else
struct alignas(16) Bytes16 {
  uint32_t x, y, z, w;
};
#endif
static_assert(sizeof(Bytes16) == 16 && alignof(Bytes16) == 16, "Bytes16 is 16 aligned bytes");

}  // namespace conveyor::gpu
