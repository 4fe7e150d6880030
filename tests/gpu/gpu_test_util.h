// gpu_test_util.h: helpers for the tests in tests/gpu (one binary, conveyor_gpu_tests, that
// links only common/, cuda/ and GoogleTest so that it runs on a GPU machine without gRPC).
#pragma once

#include <cstdlib>
#include <string>

#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"

namespace conveyor::testing {

// Skips the current test, saying why, when no CUDA device can be used.
#define CONVEYOR_REQUIRE_CUDA_DEVICE()                                                   \
  do {                                                                                   \
    std::string conveyor_why_;                                                           \
    if (::conveyor::CudaDeviceCount(&conveyor_why_) == 0)                                \
      GTEST_SKIP() << "no CUDA device, GPU test skipped: " << conveyor_why_;             \
  } while (0)

// tests/data: $CONVEYOR_TESTDATA if set (the device machine), else the build's path.
inline std::string TestdataDir() {
  if (const char* env = std::getenv("CONVEYOR_TESTDATA"); env != nullptr && *env != 0) return env;
  return CONVEYOR_TESTDATA_DIR;
}

}  // namespace conveyor::testing
