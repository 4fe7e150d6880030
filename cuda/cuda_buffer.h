// cuda_buffer.h: growable pinned-host or device memory for staging and scratch. Growth is
// rare (a batch larger than any before) and logged; steady state never allocates. The
// caller makes sure the device no longer uses the memory before it grows. CUDA sources only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "cuda/cuda_check.h"

namespace conveyor::gpu {

struct CudaBuffer {
  bool pinned = false;
  std::byte* data = nullptr;
  uint64_t capacity = 0;

  absl::Status Reserve(uint64_t bytes, const char* what) {
    if (bytes <= capacity) return absl::OkStatus();
    const uint64_t grown = std::max<uint64_t>(bytes, capacity + capacity / 2);
    if (capacity > 0) {
      std::fprintf(stderr, "conveyor: cuda: growing the %s from %llu to %llu bytes\n", what,
                   static_cast<unsigned long long>(capacity), static_cast<unsigned long long>(grown));
    }
    Free();
    void* p = nullptr;
    if (pinned) CONVEYOR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, grown, cudaHostAllocDefault));
    else CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, grown));
    data = static_cast<std::byte*>(p);
    capacity = grown;
    return absl::OkStatus();
  }
  void Free() {
    if (data == nullptr) return;
    if (pinned) cudaFreeHost(data);
    else cudaFree(data);
    data = nullptr;
    capacity = 0;
  }
};

}  // namespace conveyor::gpu
