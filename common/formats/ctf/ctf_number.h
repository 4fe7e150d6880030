// ctf_number.h: the CTF parser's branch-light fast paths for the shapes of number that fill
// real files: a plain decimal of at most 7 integer and 7 fraction digits ("%.6g" text, "1",
// "-0.0123456") and an unsigned integer of at most 8 digits (sparse indices). Eight bytes at
// a time (SWAR): the digit run's length from one mask, its value from three multiplies.
//
// Each function reads a fixed number of bytes at `p` whatever the text (the caller checks
// that they are inside its buffer) and either takes the number, returning true, or leaves
// everything to the general parser, returning false: it never reports an error and never
// accepts text the general parser would refuse. A taken real is m / 10^k with m and 10^k
// exact in T: one correctly rounded division (Clinger's fast path), so bit for bit what
// strtof/strtod and fast_float give.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace conveyor::ctf {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
inline constexpr bool kSwarNumbers = true;
#else
inline constexpr bool kSwarNumbers = false;  // the general parser does all the work
#endif

// Bytes a fast path may read at its start.
inline constexpr int kSwarRealBytes = 17;   // sign, 7 digits, '.', 8 bytes of fraction
inline constexpr int kSwarIndexBytes = 8;
inline constexpr int kSseRealBytes = 17;    // 16 bytes of classes and the terminator

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
// Length of the leading digit run of `w` (0-7), given NonDigitBytes(w) != 0.
inline int DigitRun(uint64_t non_digits) { return __builtin_ctzll(non_digits) >> 3; }

// Value of the first n (1-8) bytes of `w`, all digits.
inline uint64_t DigitsValue(uint64_t w, int n) {
  w = (w - 0x3030303030303030ull) << (64 - 8 * n);  // drop the rest; zeros lead
  w = (w * 10) + (w >> 8);
  w = (((w & 0x000000FF000000FFull) * 0x000F424000000064ull) +
       (((w >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >> 32;
  return w;
}

// What may follow a number: a delimiter (space, tab, control characters), '|' or '\n'.
inline bool EndsNumber(char c) {
  return c == ' ' || c == '|' || static_cast<unsigned char>(c) < 0x20;
}

// -v when neg, without a branch (signs are random in real data). Exact, -0.0 included.
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

inline constexpr uint64_t kPow10Int[8] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000};

// [+-]D{1,7}[.D{0,7}] followed by EndsNumber, with the digits' value exact in T.
// Reads kSwarRealBytes bytes at p. On success sets *value and *next (the terminator).
template <typename T>
inline bool SwarReal(const char* p, const char** next, T* value) {
  static constexpr T kPow10[8] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7};
  const unsigned neg = *p == '-';
  const char* q = p + (neg | (*p == '+'));
  uint64_t w = Load8(q);
  uint64_t nd = NonDigitBytes(w);
  if (nd == 0) return false;  // 8 or more integer digits
  const int n1 = DigitRun(nd);
  if (n1 == 0) return false;  // no digit first: ".5", "--1", errors
  uint64_t m = DigitsValue(w, n1);
  q += n1;
  int frac = 0;
  if (*q == '.') {
    w = Load8(q + 1);
    nd = NonDigitBytes(w);
    if (nd == 0) return false;  // 8 or more fraction digits
    frac = DigitRun(nd);
    if (frac > 0) m = m * kPow10Int[frac] + DigitsValue(w, frac);
    q += 1 + frac;
  }
  if (!EndsNumber(*q) || m > ExactDecimal<T>::kMantissa) return false;
  *value = WithSign(static_cast<T>(m) / kPow10[frac], neg);
  *next = q;
  return true;
}

#if defined(__SSE2__)
// [+-]D+[.D*] with at most 8 digits in all, followed by EndsNumber, its digits' value exact
// in T ("%.6g" text: "-0.123456", "0.0123456", "1"). One 16-byte load classifies the bytes:
// the number's end comes from one mask, so the next number's start does not wait for its
// digits; the digits, the '.' squeezed out, are one 8-byte SWAR conversion. Reads
// kSseRealBytes bytes at p. On success sets *value and *next (the terminator).

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
  // At most one '.', a digit first, at most 8 digits, a delimiter, '|' or '\n' after.
  if ((dot & (dot - 1)) != 0 || ((digits >> s) & 1) == 0 || n > 8 || !EndsNumber(p[len]))
    return false;
  const unsigned n1 = static_cast<unsigned>(__builtin_ctz(dot | (1u << len))) - s;  // before '.'
  const uint64_t keep = ~0ull >> (64 - 8 * n1);  // n1 >= 1
  const uint64_t squeezed = (Load8(p + s) & keep) | (Load8(p + s + 1) & ~keep);
  const uint64_t m = DigitsValue(squeezed, static_cast<int>(n));
  if (m > ExactDecimal<T>::kMantissa) return false;
  *value = WithSign(static_cast<T>(m) / kPow10[n - n1], neg);
  *next = p + len;
  return true;
}
#endif

// An index of 1-8 digits: reads kSwarIndexBytes bytes at p. On success sets *value and
// *next (the first byte after the digits, not checked).
inline bool SwarIndex(const char* p, const char** next, uint64_t* value) {
  const uint64_t w = Load8(p);
  const uint64_t nd = NonDigitBytes(w);
  if (nd == 0) return false;
  const int n = DigitRun(nd);
  if (n == 0) return false;
  *value = DigitsValue(w, n);
  *next = p + n;
  return true;
}

}  // namespace conveyor::ctf
