// The CTF parser's number fast paths (common/formats/ctf/ctf_number.h): every number they
// take is bit for bit what strtof/strtod give, they take exactly the shapes they claim, and
// through the parser a row whose numbers go the fast way parses (values, errors, messages)
// exactly as a row whose numbers go the general way.
#include "common/formats/ctf/ctf_number.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error_budget.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/formats/ctf/ctf_parser.h"
#include "common/log.h"
#include "gtest/gtest.h"

namespace conveyor::testing {
namespace {

// Number texts: hand-picked edge cases, structured random decimals, random strings over
// the characters of numbers, and printf output of random floats and doubles.
std::vector<std::string> NumberTexts(uint64_t seed, int random_count) {
  std::vector<std::string> t = {
      "0", "-0", "+0", "0.0", "-0.0", "+0.0", "00000000", "000000000", "0.0000000",
      "0.00000000", "-0.00000001", "1", "-1", "+1", "1.", "-1.", "5.", ".5", "-.5", "+.5",
      ".", "-", "+", "--1", "+-1", "-+1", "1..2", "1.2.3", "..1", "1-", "1+", "1-2",
      "16777215", "16777216", "16777217", "-16777217", "1677721.7", "1677721.6",
      "0.16777217", "0.16777216", "99999999", "999999999", "9999999.9", "12345678.",
      "1234567.8", "0.12345678", "0.123456789", "0.0123456", "-0.0123456", "0.00123456",
      "-0.000123456", "0.123456", "-0.732247", "007", "-007.50", "00000001.5",
      "0.30000001", "0.3", "0.1", "0.2", "3.14159265", "2.7182818", "1e5", "1E-5", "1e+5",
      "1.5e3", "-2.5E-3", "1e", "1e+", "1e-", "e5", "1.e5", "inf", "-inf", "+inf",
      "infinity", "nan", "NaN", "-nan", "0x1p3", "0x10", "1e400", "-1e400", "1e-400",
      "3.4028235e38", "3.4028236e38", "3.5e38", "1.7976931348623157e308", "1.8e308",
      "1.4e-45", "7e-46", "1e-45", "1.17549435e-38", "1e-40", "4.9e-324", "2.5e-324",
      "1,5", "1_000", "1:2", "1a", "a1", "12345678901234567890", "0.000000000000000001",
      "123456789012345678901234567890", "8388608.5", "8388609.5", "33554433", "4.5",
      "0.5", "0.25", "0.125", "1.00000006", "1.00000012", "0.999999940395",
  };
  std::mt19937_64 rng(seed);
  const auto digit = [&] { return static_cast<char>('0' + rng() % 10); };
  for (int i = 0; i < random_count; ++i) {
    std::string s;
    switch (rng() % 4) {
      case 0: {  // [+-]D*[.D*][e[+-]D+], leading zeros now and then
        const int r = static_cast<int>(rng() % 8);
        if (r == 0) s += '-';
        if (r == 1) s += '+';
        const int int_digits = static_cast<int>(rng() % 10);
        const bool zeros = rng() % 4 == 0;
        for (int d = 0; d < int_digits; ++d) s += zeros && d < 3 ? '0' : digit();
        if (rng() % 4 != 0) {
          s += '.';
          const int frac_digits = static_cast<int>(rng() % 11);
          for (int d = 0; d < frac_digits; ++d) s += digit();
        }
        if (rng() % 10 == 0) {
          s += (rng() % 2) ? 'e' : 'E';
          if (rng() % 2) s += (rng() % 2) ? '-' : '+';
          const int exp_digits = static_cast<int>(rng() % 4);
          for (int d = 0; d < exp_digits; ++d) s += digit();
        }
        break;
      }
      case 1: {  // anything made of the characters of numbers
        static const char kChars[] = "0123456789012345678901234567890123456789.-+eE";
        const int len = 1 + static_cast<int>(rng() % 12);
        for (int d = 0; d < len; ++d) s += kChars[rng() % (sizeof(kChars) - 1)];
        break;
      }
      case 2: {  // printf of a float, as files are written
        static const char* kFormats[] = {"%.6g", "%.9g", "%g", "%.3f", "%.7f", "%e", "%.2e"};
        float v;
        switch (rng() % 4) {
          case 0: v = std::uniform_real_distribution<float>(-1, 1)(rng); break;
          case 1: v = std::ldexp(static_cast<float>(rng() % 1000000), static_cast<int>(rng() % 60) - 40); break;
          case 2: {  // any bit pattern: denormals, huge, inf, nan
            const uint32_t b = static_cast<uint32_t>(rng());
            std::memcpy(&v, &b, 4);
            break;
          }
          default: v = static_cast<float>(rng() % 100000) / static_cast<float>(1 + rng() % 1000); break;
        }
        char buf[64];
        std::snprintf(buf, sizeof(buf), kFormats[rng() % 7], static_cast<double>(v));
        s = buf;
        break;
      }
      default: {  // printf of a double, 17 digits or fewer
        double v;
        const uint64_t b = rng();
        if (rng() % 2) std::memcpy(&v, &b, 8); else v = std::uniform_real_distribution<double>(-100, 100)(rng);
        char buf[64];
        std::snprintf(buf, sizeof(buf), (rng() % 2) ? "%.17g" : "%.8g", v);
        s = buf;
        break;
      }
    }
    if (!s.empty()) t.push_back(s);
  }
  return t;
}

// What SseReal claims to take: [+-]D+[.D*], at most 8 digits, value below 2^24 (float) or
// 2^53 (double).
template <typename T>
bool SseRealShape(const std::string& s) {
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i >= s.size() || s[i] < '0' || s[i] > '9') return false;
  int digits = 0, dots = 0;
  uint64_t m = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '.') {
      ++dots;
    } else if (s[i] >= '0' && s[i] <= '9') {
      ++digits;
      m = m * 10 + static_cast<uint64_t>(s[i] - '0');
    } else {
      return false;
    }
  }
  return dots <= 1 && digits <= 8 && m <= ctf::ExactDecimal<T>::kMantissa;
}

template <typename T>
T Strto(const std::string& s, char** end) {
  if constexpr (sizeof(T) == 4) return std::strtof(s.c_str(), end);
  else return std::strtod(s.c_str(), end);
}

template <typename T>
bool SameBits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

#if CTF_SIMD_NUMBERS
// `text`, then `after`, then junk, in a buffer of exactly the bytes the fast path may read.
std::unique_ptr<char[]> Buffer(const std::string& text, char after, std::mt19937_64* rng, size_t* size) {
  *size = std::max<size_t>(text.size() + 1 + 16, ctf::kSseRealBytes);
  auto buf = std::make_unique<char[]>(*size);
  for (size_t i = 0; i < *size; ++i) buf[i] = "0123456789.-+ e|\n"[(*rng)() % 17];
  std::memcpy(buf.get(), text.data(), text.size());
  buf[text.size()] = after;
  return buf;
}

template <typename T>
void CheckSseReal(const std::vector<std::string>& texts) {
  std::mt19937_64 rng(7);
  uint64_t taken = 0;
  for (const std::string& text : texts) {
    for (char after : {' ', '|', '\n', '\t', '\r', '\0', 'x', ',', ':', '#', '\x80'}) {
      size_t size;
      auto buf = Buffer(text, after, &rng, &size);
      T value = 42;
      const char* next = nullptr;
      const bool took = ctf::SseReal(buf.get(), &next, &value);
      const bool should = text.size() < 16 && SseRealShape<T>(text) && ctf::EndsNumber(after);
      ASSERT_EQ(took, should) << "'" << text << "' then byte " << static_cast<int>(after);
      if (!took) continue;
      ++taken;
      char* end;
      const T expected = Strto<T>(text, &end);
      ASSERT_EQ(end, text.c_str() + text.size()) << text;
      ASSERT_EQ(next, buf.get() + text.size()) << text;
      ASSERT_TRUE(SameBits(value, expected)) << text << ": " << value << " vs strto* " << expected;
    }
  }
  EXPECT_GT(taken, texts.size());  // the fast path is not vacuous
}

TEST(CtfNumber, SseRealTakesItsShapesBitForBitAsStrtof) { CheckSseReal<float>(NumberTexts(1, 200000)); }
TEST(CtfNumber, SseRealTakesItsShapesBitForBitAsStrtod) { CheckSseReal<double>(NumberTexts(2, 200000)); }

// Every text of at most 8 digits: all 10^k strings of k <= 4 digits, random longer ones.
TEST(CtfNumber, SseRealEveryShortDecimal) {
  std::mt19937_64 rng(3);
  std::vector<std::string> texts;
  for (int k = 1; k <= 4; ++k) {
    int limit = 1;
    for (int i = 0; i < k; ++i) limit *= 10;
    for (int v = 0; v < limit; ++v) {
      char digits[16];
      std::snprintf(digits, sizeof(digits), "%0*d", k, v);
      for (int dot = 0; dot <= k; ++dot) {  // dot == k: "D+." ; and none
        std::string with_dot = std::string(digits, dot) + "." + std::string(digits + dot);
        if (dot > 0) texts.push_back(with_dot);
        if (dot == 0) texts.push_back(digits);
      }
    }
  }
  for (int i = 0; i < 300000; ++i) {  // 5-8 digits, a dot anywhere, signs
    const int k = 5 + static_cast<int>(rng() % 4);
    std::string s = (rng() % 3 == 0) ? "-" : "";
    for (int d = 0; d < k; ++d) s += static_cast<char>('0' + rng() % 10);
    const size_t dot = rng() % (k + 1);
    if (dot > 0) s.insert(s.size() - k + dot, ".");
    texts.push_back(s);
  }
  CheckSseReal<float>(texts);
  CheckSseReal<double>(texts);
}

TEST(CtfNumber, SwarIndexTakesOneToSevenDigits) {
  std::mt19937_64 rng(4);
  for (int i = 0; i < 200000; ++i) {
    const int k = static_cast<int>(rng() % 10);
    std::string s;
    for (int d = 0; d < k; ++d) s += static_cast<char>('0' + rng() % 10);
    const char after = ":x .-/"[rng() % 6];  // '/' and ':' bracket the digits in ASCII
    s += after;
    while (s.size() < ctf::kSwarIndexBytes) s += static_cast<char>(rng() % 256);
    auto buf = std::make_unique<char[]>(s.size());
    std::memcpy(buf.get(), s.data(), s.size());
    uint64_t value = 0;
    const char* next = nullptr;
    const bool took = ctf::SwarIndex(buf.get(), &next, &value);
    ASSERT_EQ(took, k >= 1 && k <= 7) << s;
    if (!took) continue;
    EXPECT_EQ(value, std::strtoull(s.substr(0, k).c_str(), nullptr, 10)) << s;
    EXPECT_EQ(next, buf.get() + k) << s;
  }
}
#endif

// One row through CtfParser: the first stream's values (or sparse entries) and the error.
struct Parsed {
  bool ok = false;
  std::string error;
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<int32_t> indices;
};

Parsed ParseRow(const std::string& row, Precision precision, StreamFormat format) {
  CtfParserOptions po;
  po.path = "t.ctf";
  po.precision = precision;
  po.streams = {{"a", "a", format, format == StreamFormat::kDense ? 8u : 50000u, false},
                {"b", "b", StreamFormat::kDense, 1, false}};
  Diagnostics diagnostics(0, [](Severity, const std::string&) {});
  ErrorBudget budget(0);
  CtfParser parser(po, &diagnostics, &budget);
  // Exactly the row's bytes, so that a read past them is a sanitizer's error.
  auto bytes = std::make_unique<char[]>(row.size());
  std::memcpy(bytes.get(), row.data(), row.size());
  SequenceEntry e;
  e.size = static_cast<uint32_t>(row.size());
  e.num_samples = 1;
  auto chunk = parser.ParseSequences(std::string_view(bytes.get(), row.size()), {e});
  Parsed r;
  if (!chunk.ok()) {
    r.error = std::string(chunk.status().message());
    return r;
  }
  r.ok = true;
  const ParsedStream& ps = (*chunk)->streams[0];
  r.f32.assign(ps.values_f32.begin(), ps.values_f32.end());
  r.f64.assign(ps.values_f64.begin(), ps.values_f64.end());
  r.indices.assign(ps.indices.begin(), ps.indices.end());
  return r;
}

template <typename T>
const std::vector<T>& Values(const Parsed& r) {
  if constexpr (sizeof(T) == 4) return r.f32;
  else return r.f64;
}

// "t.ctf:1:COL: what" with COL moved by `shift`.
std::string ShiftColumn(const std::string& error, int shift) {
  const std::string prefix = "t.ctf:1:";
  if (error.compare(0, prefix.size(), prefix) != 0) return error;
  const size_t colon = error.find(':', prefix.size());
  const int col = std::atoi(error.substr(prefix.size(), colon - prefix.size()).c_str());
  return prefix + std::to_string(col + shift) + error.substr(colon);
}

// `text` as the first value of a short row (too close to the row's end for a fast path:
// the general parser reads it) and as the first and a middle value of a long row (the
// fast paths read it when they take its shape): the same acceptance, the same bits (and
// strtof's/strtod's), the same error at the same place.
template <typename T>
void CheckThroughParser(const std::vector<std::string>& texts, StreamFormat format) {
  const Precision precision = sizeof(T) == 4 ? Precision::kFloat : Precision::kDouble;
  const bool dense = format == StreamFormat::kDense;
  const std::string first = dense ? "" : "3:";  // the entry written before `text`
  const std::string before = dense ? "0.5 -0.25 " : "4:0.5 5:-0.25 ";
  // Dense: 6 values in the head row (zero-padded to dim 8), 8 in the middle one.
  const std::string after = dense ? " 0.125 -0.0625 1 2 3 |b 1\n" : " 6:0.125 7:1 8:1 9:-1 10:2 11:1 |b 1\n";
  uint64_t ok_count = 0;
  for (const std::string& text : texts) {
    const std::string value = first + text;
    const Parsed general = ParseRow("|a " + value + " |b 1\n", precision, format);
    const Parsed head = ParseRow("|a " + value + after, precision, format);
    const Parsed middle = ParseRow("|a " + before + value + after, precision, format);
    ASSERT_EQ(head.ok, general.ok) << value << ": " << general.error << " | " << head.error;
    ASSERT_EQ(middle.ok, general.ok) << value << ": " << general.error << " | " << middle.error;
    if (!general.ok) {
      EXPECT_EQ(head.error, general.error) << value;
      EXPECT_EQ(middle.error, ShiftColumn(general.error, static_cast<int>(before.size()))) << value;
      continue;
    }
    ++ok_count;
    const std::vector<T>& g = Values<T>(general);
    const std::vector<T>& h = Values<T>(head);
    const std::vector<T>& m = Values<T>(middle);
    ASSERT_FALSE(g.empty());
    ASSERT_EQ(h.size(), dense ? 8u : 7u) << value;  // dense: zero-padded
    ASSERT_EQ(m.size(), dense ? 8u : 9u) << value;
    char* end;
    const T expected = Strto<T>(text, &end);
    ASSERT_EQ(end, text.c_str() + text.size()) << text << " was taken but is not all number";
    EXPECT_TRUE(SameBits(g[0], expected)) << text << ": general " << g[0] << " vs strto* " << expected;
    EXPECT_TRUE(SameBits(h[0], expected)) << text << ": head " << h[0] << " vs strto* " << expected;
    EXPECT_TRUE(SameBits(m[2], expected)) << text << ": middle " << m[2] << " vs strto* " << expected;
    if (!dense) {
      EXPECT_EQ(h.size(), head.indices.size());
      EXPECT_EQ(head.indices[0], 3);
      EXPECT_EQ(middle.indices[2], 3);
    }
    // The values around it too.
    EXPECT_TRUE(SameBits(m[0], static_cast<T>(0.5)) && SameBits(m[1], static_cast<T>(-0.25)) &&
                SameBits(h[1], static_cast<T>(0.125)))
        << value;
  }
  EXPECT_GT(ok_count, texts.size() / 4);
}

TEST(CtfNumber, DenseFloatRowsParseAlikeEitherWay) {
  CheckThroughParser<float>(NumberTexts(11, 30000), StreamFormat::kDense);
}
TEST(CtfNumber, DenseDoubleRowsParseAlikeEitherWay) {
  CheckThroughParser<double>(NumberTexts(12, 30000), StreamFormat::kDense);
}
TEST(CtfNumber, SparseFloatRowsParseAlikeEitherWay) {
  CheckThroughParser<float>(NumberTexts(13, 30000), StreamFormat::kSparse);
}
TEST(CtfNumber, SparseDoubleRowsParseAlikeEitherWay) {
  CheckThroughParser<double>(NumberTexts(14, 20000), StreamFormat::kSparse);
}

// Many one-line sequences in one file: the fast paths read past a sequence's newline into
// the next line (sequence ids, digits) but must stop at it. Each value as the general path
// reads its row alone; a bad row is the same dropped sequence either way.
template <typename T>
void CheckAcrossSequences(StreamFormat format, bool final_newline) {
  const Precision precision = sizeof(T) == 4 ? Precision::kFloat : Precision::kDouble;
  const bool dense = format == StreamFormat::kDense;
  const std::vector<std::string> texts = NumberTexts(21, 20000);
  std::string file;
  std::vector<Parsed> expected;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string value = (dense ? "" : "7:") + texts[i];
    const std::string tail = (i % 3 == 0) ? "" : " |b 1";  // the number right before '\n'
    file += std::to_string(i) + " |a " + value + tail + "\n";
    expected.push_back(ParseRow("|a " + value + tail + "\n", precision, format));
  }
  if (!final_newline) file.pop_back();
  auto bytes = std::make_unique<char[]>(file.size());  // exactly the file
  std::memcpy(bytes.get(), file.data(), file.size());
  const std::string_view view(bytes.get(), file.size());
  CtfIndexOptions io;
  io.threads = 1;
  auto index = BuildCtfIndex(view, "t.ctf", io);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->sequences.size(), texts.size());
  CtfParserOptions po;
  po.path = "t.ctf";
  po.precision = precision;
  po.streams = {{"a", "a", format, dense ? 8u : 50000u, false}, {"b", "b", StreamFormat::kDense, 1, false}};
  Diagnostics diagnostics(0, [](Severity, const std::string&) {});
  ErrorBudget budget(UINT64_MAX);
  CtfParser parser(po, &diagnostics, &budget);
  uint64_t kept = 0;
  for (uint64_t c = 0; c < index->chunks.size(); ++c) {
    auto chunk = parser.ParseChunk(view, *index, c);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const ParsedChunk& pc = **chunk;
    const ParsedStream& a = pc.streams[0];
    const HugeVector<T>& values = a.values<T>();
    for (uint64_t k = 0; k < index->chunks[c].num_sequences; ++k) {
      const uint64_t i = index->chunks[c].first_sequence + k;
      const int32_t slot = pc.slot_of[k];
      ASSERT_EQ(slot >= 0, expected[i].ok) << texts[i] << ": " << expected[i].error;
      if (slot < 0) continue;
      ++kept;
      const T got = dense ? values[static_cast<size_t>(slot) * 8] : values[a.nnz_begin[a.sequence_begin[slot]]];
      ASSERT_TRUE(SameBits(got, Values<T>(expected[i])[0])) << texts[i];
      if (!dense) {
        ASSERT_EQ(a.indices[a.nnz_begin[a.sequence_begin[slot]]], 7);
      }
    }
  }
  EXPECT_GT(kept, texts.size() / 4);
}

TEST(CtfNumber, DenseFastPathsStopAtEachSequencesNewline) {
  CheckAcrossSequences<float>(StreamFormat::kDense, true);
  CheckAcrossSequences<double>(StreamFormat::kDense, false);
}
TEST(CtfNumber, SparseFastPathsStopAtEachSequencesNewline) {
  CheckAcrossSequences<float>(StreamFormat::kSparse, false);
  CheckAcrossSequences<double>(StreamFormat::kSparse, true);
}

// Sparse indices: the bulk path's SWAR index against the general path, errors included.
TEST(CtfNumber, SparseIndicesParseAlikeEitherWay) {
  std::vector<std::string> indices = {"0", "00", "0000000", "00000000", "000000000", "7", "49999",
                                      "50000", "50001", "0049999", "0050000", "9999999", "99999999",
                                      "123456789", "4294967296", "18446744073709551616",
                                      "99999999999999999999", "-1", "+1", "1.5", "1a", "a", "",
                                      " 1", "1e1", "1:", "１"};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int k = static_cast<int>(rng() % 9);
    for (int d = 0; d < k; ++d) s += static_cast<char>('0' + rng() % 10);
    if (rng() % 8 == 0) s.insert(rng() % (s.size() + 1), 1, "-+.xe:/"[rng() % 7]);
    indices.push_back(s);
  }
  const std::string after = " 6:0.125 7:1 8:1 9:-1 10:2 11:1 |b 1\n";
  for (const std::string& index : indices) {
    for (const std::string& value : {std::string("1"), std::string("-0.5"), std::string("1e3")}) {
      const std::string entry = index + ":" + value;
      const Parsed general = ParseRow("|a " + entry + " |b 1\n", Precision::kFloat, StreamFormat::kSparse);
      const Parsed head = ParseRow("|a " + entry + after, Precision::kFloat, StreamFormat::kSparse);
      ASSERT_EQ(head.ok, general.ok) << entry << ": " << general.error << " | " << head.error;
      if (!general.ok) {
        EXPECT_EQ(head.error, general.error) << entry;
        continue;
      }
      ASSERT_EQ(head.indices.size(), 7u) << entry;
      EXPECT_EQ(head.indices[0], general.indices[0]) << entry;
      EXPECT_EQ(head.indices[0], static_cast<int32_t>(std::strtoll(index.c_str(), nullptr, 10))) << entry;
      EXPECT_TRUE(SameBits(head.f32[0], general.f32[0])) << entry;
    }
  }
}

// The general path's messages, as before the fast paths, for malformed text where a fast
// path would otherwise have been tried (long rows).
TEST(CtfNumber, MalformedNumbersKeepTheirMessages) {
  const std::string tail = " 0.125 -0.0625 1 2 3 4 5 |b 1\n";
  const struct {
    const char* text;
    const char* error;
  } cases[] = {
      {"12.+", "t.ctf:1:7: unexpected '+' in a number for input 'a'"},
      {".5", "t.ctf:1:4: unexpected '.': expected a number for input 'a'"},
      {"--1", "t.ctf:1:4: unexpected '-': expected a number for input 'a'"},
      {"-", "t.ctf:1:4: unexpected ' ': expected a number for input 'a'"},
      {"1.2.3", "t.ctf:1:7: unexpected '.' in a number for input 'a'"},
      {"2,0", "t.ctf:1:5: unexpected ',' in a number for input 'a'"},
      {"0.5x", "t.ctf:1:7: unexpected 'x' in a number for input 'a'"},
      {"nan", "t.ctf:1:4: unexpected 'n': expected a number for input 'a'"},
      {"1e400", "t.ctf:1:4: number out of range for input 'a'"},
      {"3.5e38", "t.ctf:1:4: number out of range for input 'a'"},
      {"0.1234\x80", "t.ctf:1:10: unexpected byte 0x80 in a number for input 'a'"},
  };
  for (const auto& c : cases) {
    const Parsed r = ParseRow(std::string("|a ") + c.text + tail, Precision::kFloat, StreamFormat::kDense);
    ASSERT_FALSE(r.ok) << c.text;
    EXPECT_EQ(r.error.substr(0, r.error.find(" (more than")), c.error) << c.text;
  }
  const Parsed sparse = ParseRow("|a 50000:1 6:0.125 7:1 8:1 9:-1 10:2 11:1 |b 1\n", Precision::kFloat,
                                 StreamFormat::kSparse);
  EXPECT_EQ(sparse.error.substr(0, sparse.error.find(" (more than")),
            "t.ctf:1:4: sparse index 50000 of input 'a' is out of range: expected an index below dim=50000");
}

}  // namespace
}  // namespace conveyor::testing
