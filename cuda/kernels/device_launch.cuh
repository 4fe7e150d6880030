// device_launch.cuh (CUDA sources only): the `__global__` wrappers of the kernel bodies
// (grid.h): they pass CUDA's built-ins as the Grid and, for a phased kernel, put
// __syncthreads() between its phases (host_executor.h says what a kernel provides). Each
// launch is checked at once (cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/grid.h"

namespace conveyor::gpu {

template <typename K>
__global__ void RunKernel(const K kernel) {
  kernel(Grid{blockIdx.x, threadIdx.x, blockDim.x, gridDim.x});
}

template <typename K>
__global__ void RunPhasedKernel(const K kernel) {
  __shared__ typename K::Shared shared;
  const Grid g{blockIdx.x, threadIdx.x, blockDim.x, gridDim.x};
  const uint64_t steps = kernel.steps();
  for (uint64_t step = g.block; step < steps; step += g.grid_dim) {  // block-uniform: barriers are safe
    for (int phase = 0; phase < K::kPhases; ++phase) {
      kernel(phase, step, g, shared);
      __syncthreads();
    }
  }
}

// Launches `kernel` with `shape` on `stream`; `name` says which in the error.
template <typename K>
absl::Status LaunchOnDevice(const K& kernel, LaunchShape shape, cudaStream_t stream, const char* name) {
  RunKernel<K><<<shape.blocks, shape.threads, 0, stream>>>(kernel);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return CudaError(err, name, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

template <typename K>
absl::Status LaunchPhasedOnDevice(const K& kernel, LaunchShape shape, cudaStream_t stream, const char* name) {
  RunPhasedKernel<K><<<shape.blocks, shape.threads, 0, stream>>>(kernel);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return CudaError(err, name, __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::gpu
