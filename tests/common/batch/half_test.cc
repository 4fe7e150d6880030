// float32 -> float16 / bfloat16 (common/batch/half.h) against independent references: x86's
// F16C instruction (vcvtps2ph, round to nearest even) where the CPU has it, and an exact
// long-hand rounding in double arithmetic for every finite value; on every class of input
// (zeros, subnormals of both formats, normals, the overflow edge, ties both ways,
// infinities, quiet and signaling NaNs of both signs).
#include <cpuid.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/batch/half.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Whether the CPU has F16C (CPUID leaf 1, ECX bit 29). By CPUID, not
// __builtin_cpu_supports("f16c"), which clang 14 (the fuzzers' compiler) does not know.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

__attribute__((target("f16c"))) uint16_t HardwareHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// The value of a float16 bit pattern (finite), exactly, as a double.
double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

// Rounds finite `f` to float16 by searching the two neighbours and comparing exact
// distances (doubles hold every float and every float16 exactly, and their differences).
uint16_t ReferenceHalf(float f) {
  const double x = f;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0;  // largest magnitude <= a
  for (int bit = 14; bit >= 0; --bit) {
    const uint16_t trial = static_cast<uint16_t>(lo | (1u << bit));
    if (trial <= 0x7BFF && HalfValue(trial) <= a) lo = trial;
  }
  if (HalfValue(lo) == a) return sign | lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double dlo = a - HalfValue(lo), dhi = (hi == 0x7C00 ? 65536.0 : HalfValue(hi)) - a;
  if (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) return sign | lo;
  return sign | hi;
}

uint16_t ReferenceBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint32_t lo = u & 0xFFFF0000u;  // truncation: toward zero
  const uint32_t hi = lo + 0x10000u;
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(FromBits(lo)));
  // hi may be infinity's pattern: its "value" for rounding is 2^128.
  const double vhi = (hi & 0x7FFFFFFFu) == 0x7F800000u ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(FromBits(hi)));
  const double dlo = a - vlo, dhi = vhi - a;
  if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0)) return static_cast<uint16_t>(lo >> 16);
  return static_cast<uint16_t>(hi >> 16);
}

// Every upper-16-bit pattern (sign, exponent, top mantissa bits: every class) with low bits
// that land below, on and above both formats' rounding points, plus random patterns.
std::vector<uint32_t> Inputs() {
  std::vector<uint32_t> out;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000,
                           0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xE000, 0xF000, 0xFFFF};
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : lows) out.push_back((high << 16) | low);
  }
  std::mt19937 rng(20261124);
  for (int i = 0; i < 2000000; ++i) out.push_back(rng());
  return out;
}

TEST(Half, Float16IsRoundToNearestEvenOnEveryClass) {
  const bool f16c = HasF16c();
  uint64_t checked_hw = 0, checked_ref = 0;
  for (uint32_t u : Inputs()) {
    const float f = FromBits(u);
    const uint16_t got = FloatToHalfBits(f);
    if (f16c) {
      ASSERT_EQ(got, HardwareHalf(f)) << std::hex << "input 0x" << u;
      ++checked_hw;
    }
    if (!std::isnan(f) && !std::isinf(f) && (u & 0xFF) == 0) {  // the slow reference on a subset
      ASSERT_EQ(got, ReferenceHalf(f)) << std::hex << "input 0x" << u;
      ++checked_ref;
    }
  }
  EXPECT_GT(checked_ref, 400000u);
  if (!f16c) GTEST_SKIP() << "this CPU has no F16C: checked against the long-hand reference only";
}

TEST(Half, Float16EdgesByHand) {
  EXPECT_EQ(FloatToHalfBits(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7BFF);                     // largest finite
  EXPECT_EQ(FloatToHalfBits(65519.996f), 0x7BFF);                   // just below the tie
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7C00);                     // the tie rounds to even: infinity
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);        // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);        // half of it: ties to even (0)
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(3.0f, -25)), 0x0002);        // 1.5 ulp: ties to even (2)
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -14)), 0x0400);        // smallest normal
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie below an even mantissa
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie above an odd one
  EXPECT_EQ(FloatToHalfBits(INFINITY), 0x7C00);
  EXPECT_EQ(FloatToHalfBits(-INFINITY), 0xFC00);
  EXPECT_EQ(FloatToHalfBits(FromBits(0x7FC00000)), 0x7E00);  // quiet NaN
  EXPECT_EQ(FloatToHalfBits(FromBits(0xFF800001)), 0xFE00);  // signaling NaN: quieted, sign kept
  EXPECT_EQ(FloatToHalfBits(FromBits(0x7FA02000)), 0x7F01);  // payload's top bits kept
}

TEST(Half, BFloat16IsRoundToNearestEvenOnEveryClass) {
  for (uint32_t u : Inputs()) {
    const float f = FromBits(u);
    ASSERT_EQ(FloatToBFloat16Bits(f), ReferenceBFloat16(f)) << std::hex << "input 0x" << u;
  }
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7F7FFFFF)), 0x7F80);  // largest float: infinity
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x00008000)), 0x0000);  // subnormal tie to even zero
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0xFF800001)), 0xFFC0);  // signaling NaN quieted
  EXPECT_EQ(FloatToBFloat16Bits(-INFINITY), 0xFF80);
}

// Widening (how dumps print narrowed values) is exact: every pattern that is not a NaN comes
// back unchanged, every NaN as a NaN of the same sign, quiet.
TEST(Half, WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(FloatToHalfBits(f), h | 0x200) << h;
    } else {
      ASSERT_EQ(FloatToHalfBits(f), h) << h;
      if ((h & 0x7C00) != 0x7C00) {
        ASSERT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(h))) << h;
      }
    }
    const float g = BFloat16BitsToFloat(static_cast<uint16_t>(h));
    const bool bnan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    ASSERT_EQ(FloatToBFloat16Bits(g), bnan ? (h | 0x40) : h) << h;
  }
}

}  // namespace
}  // namespace conveyor
