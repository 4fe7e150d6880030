// half.h: float32 -> float16 (IEEE binary16) and float32 -> bfloat16, rounding to nearest,
// ties to even. What a subscriber's `dtypes` ask the assemblers for: the CPU assembler and the
// CUDA kernels call these same functions, so their bytes agree by construction.
//   - finite values round to nearest even; float16 overflows (|x| >= 65520) to infinity and
//     underflows through its subnormals to zero (keeping the sign);
//   - infinities stay infinities;
//   - a NaN stays a NaN of the same sign, quiet, keeping the top bits of its payload (what
//     x86's F16C instruction vcvtps2ph does; bfloat16 the same, keeping 7 payload bits).
// Header-only; compiled by g++ and nvcc alike (host and device functions under nvcc).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CONVEYOR_HALF_HD __host__ __device__
#else
#define CONVEYOR_HALF_HD
#endif

namespace conveyor {

inline CONVEYOR_HALF_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

inline CONVEYOR_HALF_HD uint16_t FloatToHalfBits(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // infinity or NaN
    if (a == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520: rounds past 65504 to infinity
  if (a >= 0x38800000u) {                       // >= 2^-14: a normal float16
    uint32_t h = (a >> 13) - (112u << 10);      // exponent rebiased from 127 to 15
    const uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal float16 (or zero): value / 2^-24 = mantissa * 2^(e - 126), rounded.
  const uint32_t e = a >> 23;
  if (e < 101) return sign;  // below 2^-25 (exactly half of the smallest subnormal): zero
  const uint32_t mantissa = (a & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  const uint32_t shift = 126u - e;  // 14 .. 25
  uint32_t h = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half_way = 1u << (shift - 1u);
  if (rest > half_way || (rest == half_way && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline CONVEYOR_HALF_HD uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: quiet, sign and top payload kept
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The exact float32 values of float16 and bfloat16 bit patterns (every one is a float).
inline CONVEYOR_HALF_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t u;
  if (e == 0x1F) {
    u = sign | 0x7F800000u | (m << 13);  // infinity, NaN (payload kept)
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {  // subnormal: m * 2^-24, normalized
    uint32_t shift = 0;
    while ((m << shift & 0x400u) == 0) ++shift;
    u = sign | ((113u - shift) << 23) | (((m << shift) & 0x3FFu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

inline CONVEYOR_HALF_HD float BFloat16BitsToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace conveyor
