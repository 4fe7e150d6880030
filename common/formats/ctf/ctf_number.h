// ctf_number.h: the CTF parser's fast paths for the shapes of number that fill real files:
// a plain decimal of at most 8 digits ("%.6g" text: "-0.123456", "0.0123456", "1") and a
// sparse index of at most 8 digits. One 16-byte SSE2 load classifies a number's bytes, so
// its end (where the next number starts) is known from one mask without waiting for the
// digits; the digits are converted eight at a time in a 64-bit word (SWAR).
//
// Each function reads a fixed number of bytes at `p` whatever the text (the caller checks
// that they lie inside its buffer) and either takes the number, returning true, or leaves
// it to the general parser, returning false: it never reports an error and never takes
// text the general parser would refuse. A taken real is m / 10^k with m and 10^k exact in
// T: one correctly rounded division (Clinger's fast path), so bit for bit what
// strtof/strtod and fast_float give. Little-endian x86 only (SSE2 is part of x86-64);
// elsewhere CTF_SIMD_NUMBERS is 0 and the general parser does all the work.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#define CTF_SIMD_NUMBERS 1
#else
#define CTF_SIMD_NUMBERS 0
#endif

namespace conveyor::ctf {

// What may follow a number: a delimiter (space, tab, control characters), '|' or '\n'.
inline bool EndsNumber(char c) {
  return c == ' ' || c == '|' || static_cast<unsigned char>(c) < 0x20;
}

// -v when neg, without a branch (signs are random in real data: a branch here mispredicted
// half the time). Exact, -0.0 included.
inline float WithSign(float v, unsigned neg) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b ^= neg << 31;
  std::memcpy(&v, &b, 4);
  return v;
}
inline double WithSign(double v, unsigned neg) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  b ^= static_cast<uint64_t>(neg) << 63;
  std::memcpy(&v, &b, 8);
  return v;
}

// Integers below kMantissa and powers of ten up to 10^kMaxPow10 are exact in T.
template <typename T>
struct ExactDecimal;
template <>
struct ExactDecimal<float> {
  static constexpr uint64_t kMantissa = 1ull << 24;
  static constexpr int kMaxPow10 = 10;
};
template <>
struct ExactDecimal<double> {
  static constexpr uint64_t kMantissa = 1ull << 53;
  static constexpr int kMaxPow10 = 22;
};

#if CTF_SIMD_NUMBERS
// Bytes a fast path may read at its start.
inline constexpr int kSseRealBytes = 17;  // 16 bytes classified, and the terminator
inline constexpr int kSwarIndexBytes = 8;

inline uint64_t Load8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// 0x80 in each byte of `w` that is not an ASCII digit, exact up to and including the first
// such byte (bytes past it may be flagged wrongly: borrows and carries run upwards only).
inline uint64_t NonDigitBytes(uint64_t w) {
  return ((w - 0x3030303030303030ull) | (w + 0x4646464646464646ull)) & 0x8080808080808080ull;
}

// Value of the first n (1-8) bytes of `w`, all digits, the first the most significant.
inline uint64_t DigitsValue(uint64_t w, int n) {
  w = (w - 0x3030303030303030ull) << (64 - 8 * n);  // drop the rest; zeros lead
  w = (w * 10) + (w >> 8);                           // pairs
  return (((w & 0x000000FF000000FFull) * 0x000F424000000064ull) +           // 100, 10^6
          (((w >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >>  // 1, 10^4
         32;
}

// [+-]D+[.D*] with at most 8 digits in all, followed by EndsNumber, its digits' value exact
// in T. Reads kSseRealBytes bytes at p. On success sets *value and *next (the terminator).
template <typename T>
inline bool SseReal(const char* p, const char** next, T* value) {
  static constexpr T kPow10[9] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8};
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i d = _mm_sub_epi8(x, _mm_set1_epi8('0'));
  const unsigned digits = static_cast<unsigned>(
      _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d)));
  const unsigned dots = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('.'))));
  const unsigned neg = *p == '-';
  const unsigned s = neg | (*p == '+');
  // The first byte that is neither the sign, a digit nor a '.' (16: none in the load).
  const unsigned len = static_cast<unsigned>(__builtin_ctz(~(digits | dots | s)));
  const unsigned dot = dots & ((1u << len) - 1);
  const unsigned n = len - s - (dot != 0);  // digits
  // At most one '.', a digit first, at most 8 digits (so len < 16), and after the number a
  // delimiter, '|' or '\n'.
  if ((dot & (dot - 1)) != 0 || ((digits >> s) & 1) == 0 || n > 8 || !EndsNumber(p[len]))
    return false;
  const unsigned n1 = static_cast<unsigned>(__builtin_ctz(dot | (1u << len))) - s;  // before '.'
  const uint64_t keep = ~0ull >> (64 - 8 * n1);  // n1 >= 1: the integer digits' bytes
  const uint64_t squeezed = (Load8(p + s) & keep) | (Load8(p + s + 1) & ~keep);  // '.' out
  const uint64_t m = DigitsValue(squeezed, static_cast<int>(n));
  if (m > ExactDecimal<T>::kMantissa) return false;
  *value = WithSign(static_cast<T>(m) / kPow10[n - n1], neg);
  *next = p + len;
  return true;
}

// An index of 1-7 digits. Reads kSwarIndexBytes bytes at p. On success sets *value and
// *next (the first byte after the digits, which the caller checks).
inline bool SwarIndex(const char* p, const char** next, uint64_t* value) {
  const uint64_t w = Load8(p);
  const uint64_t nd = NonDigitBytes(w);
  if (nd == 0) return false;  // 8 digits or more
  const int n = __builtin_ctzll(nd) >> 3;
  if (n == 0) return false;
  *value = DigitsValue(w, n);
  *next = p + n;
  return true;
}
#endif

}  // namespace conveyor::ctf
