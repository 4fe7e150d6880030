// kaldi_cm_math.h: Kaldi's compressed-matrix arithmetic (CM, CM2, CM3), shared by the CPU
// decoder (kaldi_object.cc) and the CUDA kernels (cuda/kaldi_cm_device.cu), so both give
// the same floats. Bit-exact only when compiled without FMA contraction (host:
// -ffp-contract=off; device: --fmad=false): the operations below are Kaldi's, in Kaldi's
// order, with Kaldi's float/double conversions (Kaldi's matrix/compressed-matrix.cc).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CONVEYOR_HOST_DEVICE __host__ __device__
#else
#define CONVEYOR_HOST_DEVICE
#endif

namespace conveyor::kaldi {

// A stored uint16 percentile of a CM column.
CONVEYOR_HOST_DEVICE inline float CmPercentile(float min_value, float range, uint16_t v) {
  return min_value + range * 1.52590218966964e-05F * static_cast<float>(v);
}

// One CM byte, given its column's four percentiles.
CONVEYOR_HOST_DEVICE inline float CmByte(float p0, float p25, float p75, float p100, uint8_t v) {
  if (v <= 64) return static_cast<float>(p0 + static_cast<double>((p25 - p0) * static_cast<float>(v)) * (1 / 64.0));
  if (v <= 192) {
    return static_cast<float>(p25 + static_cast<double>((p75 - p25) * static_cast<float>(v - 64)) * (1 / 128.0));
  }
  return static_cast<float>(p75 + static_cast<double>((p100 - p75) * static_cast<float>(v - 192)) * (1 / 63.0));
}

// The 256 floats a CM column's bytes decode to: CmByte for every v, segment by segment with
// the same operations in the same order (so a lookup equals CmByte bit for bit), in loops
// without branches that the compiler vectorizes. Cheaper than CmByte per value from about
// 50 rows a column on (CmByte mispredicts its segment branch).
CONVEYOR_HOST_DEVICE inline void CmColumnTable(float p0, float p25, float p75, float p100, float* table) {
  const float d0 = p25 - p0, d1 = p75 - p25, d2 = p100 - p75;
  for (int v = 0; v <= 64; ++v) {
    table[v] = static_cast<float>(p0 + static_cast<double>(d0 * static_cast<float>(v)) * (1 / 64.0));
  }
  for (int v = 65; v <= 192; ++v) {
    table[v] = static_cast<float>(p25 + static_cast<double>(d1 * static_cast<float>(v - 64)) * (1 / 128.0));
  }
  for (int v = 193; v <= 255; ++v) {
    table[v] = static_cast<float>(p75 + static_cast<double>(d2 * static_cast<float>(v - 192)) * (1 / 63.0));
  }
}

// CM2 (uint16) and CM3 (uint8): min + v * increment, the increment rounded to float first.
CONVEYOR_HOST_DEVICE inline float Cm2Increment(float range) { return static_cast<float>(static_cast<double>(range) * (1.0 / 65535.0)); }
CONVEYOR_HOST_DEVICE inline float Cm3Increment(float range) { return static_cast<float>(static_cast<double>(range) * (1.0 / 255.0)); }
CONVEYOR_HOST_DEVICE inline float CmLinear(float min_value, float increment, uint32_t v) {
  const float prod = static_cast<float>(v) * increment;
  return min_value + prod;
}

}  // namespace conveyor::kaldi
