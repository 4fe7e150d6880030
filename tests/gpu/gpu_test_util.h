// gpu_test_util.h: helpers for the tests in tests/gpu (conveyor_gpu_tests and
// conveyor_kernel_tests link only common/, cuda/ and GoogleTest, so they run on a GPU machine
// without gRPC, and the kernel tests under the sanitizers).
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"

namespace conveyor::testing {

// CONVEYOR_REQUIRE_GPU=1 (set by the GPU bundle's run.sh): a GPU test that cannot run is a
// failure, not a skip, so that a machine whose device is unusable cannot pass.
inline bool GpuRequired() {
  const char* env = std::getenv("CONVEYOR_REQUIRE_GPU");
  return env != nullptr && *env != 0 && std::strcmp(env, "0") != 0;
}

// Skips the current test, saying why, when no CUDA device can be used (fails it instead
// under CONVEYOR_REQUIRE_GPU=1).
#define CONVEYOR_REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                          \
    std::string conveyor_why_;                                                                  \
    if (::conveyor::CudaDeviceCount(&conveyor_why_) == 0) {                                     \
      if (::conveyor::testing::GpuRequired())                                                   \
        GTEST_FAIL() << "no CUDA device, and CONVEYOR_REQUIRE_GPU is set: " << conveyor_why_;   \
      GTEST_SKIP() << "no CUDA device, GPU test skipped: " << conveyor_why_;                    \
    }                                                                                           \
  } while (0)

// tests/data: $CONVEYOR_TESTDATA if set (the device machine), else the build's path.
inline std::string TestdataDir() {
  if (const char* env = std::getenv("CONVEYOR_TESTDATA"); env != nullptr && *env != 0) return env;
  return CONVEYOR_TESTDATA_DIR;
}

}  // namespace conveyor::testing
