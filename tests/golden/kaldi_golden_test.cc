// Kaldi tables against what Kaldi's own readers return (tests/data/kaldi: CASES.tsv and
// gt/*.gt, tests/data/README.md): every case's keys, shapes and values, bit for bit, for float and
// double readers, ark and scp, binary, text and compressed (CM, CM2, CM3) objects, ranges and
// int32 vectors; Kaldi's errors as errors. Where conveyor deliberately reads more than Kaldi
// (`[,c1:c2]`, "-inf" in text, the empty-CM leftover bytes) the test says so and checks the
// extra values by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_split.h"
#include "common/formats/kaldi/kaldi_table.h"
#include "tests/test_util.h"

namespace conveyor::kaldi {
namespace {

std::string KaldiDir() { return testing::TestdataDir() + "/kaldi"; }

struct GtEntry {
  std::string key;
  std::string type;  // fm, dm, iv
  int64_t rows = 0, cols = 0;
  std::vector<std::string> values;
};
struct Gt {
  std::vector<GtEntry> entries;
  bool ok = true;
  size_t count = 0;
};

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() + 0 && s[i + 1] == 'x') {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

Gt ReadGt(const std::string& path) {
  Gt gt;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("#end ", 0) == 0) {
      std::istringstream ss(line.substr(5));
      std::string status;
      ss >> status >> gt.count;
      gt.ok = status == "ok";
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    GtEntry e;
    std::string key;
    ss >> key >> e.type;
    e.key = Unescape(key);
    if (e.type == "iv") {
      ss >> e.cols;
      e.rows = 1;
    } else {
      ss >> e.rows >> e.cols;
    }
    std::string v;
    while (ss >> v) e.values.push_back(v);
    EXPECT_EQ(static_cast<int64_t>(e.values.size()), e.type == "iv" ? e.cols : e.rows * e.cols) << path << " " << key;
    gt.entries.push_back(std::move(e));
  }
  return gt;
}

template <typename T>
T ParseValue(const std::string& s);
template <>
float ParseValue<float>(const std::string& s) { return std::strtof(s.c_str(), nullptr); }
template <>
double ParseValue<double>(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

template <typename T>
bool SameBits(T a, T b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Compares entry i of `table` with `gt`, bit for bit.
template <typename T>
void ExpectEntry(const KaldiTable& table, size_t i, const GtEntry& gt, const std::string& where) {
  const TableEntry& e = table.entries()[i];
  EXPECT_EQ(e.key, gt.key) << where;
  if (gt.type == "iv") {
    std::vector<int32_t> ids;
    table.DecodeInts(i, &ids);
    ASSERT_EQ(static_cast<int64_t>(ids.size()), gt.cols) << where << " " << gt.key;
    for (size_t k = 0; k < ids.size(); ++k) ASSERT_EQ(ids[k], std::stoi(gt.values[k])) << where << " " << gt.key << " [" << k << "]";
    return;
  }
  // An empty matrix is 0 x 0 whatever its stored shape.
  const int64_t rows = e.window.cols == 0 ? 0 : e.window.rows, cols = e.window.rows == 0 ? 0 : e.window.cols;
  ASSERT_EQ(rows, gt.rows) << where << " " << gt.key;
  ASSERT_EQ(cols, gt.cols) << where << " " << gt.key;
  std::vector<T> got(static_cast<size_t>(rows * cols));
  table.Decode<T>(i, got.data());
  size_t mismatches = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const T want = ParseValue<T>(gt.values[k]);
    if (!SameBits(got[k], want)) {
      if (++mismatches <= 3) ADD_FAILURE() << where << " " << gt.key << " value " << k << ": got " << got[k] << " want " << gt.values[k];
    }
  }
  EXPECT_EQ(mismatches, 0u) << where << " " << gt.key;
}

TableOptions Options(const std::string& reader, bool tolerate = false) {
  TableOptions o;
  o.kind = reader == "iv" ? ObjectKind::kInt32Vector : ObjectKind::kMatrix;
  o.base_dir = KaldiDir();
  if (tolerate) o.tolerate = [](const std::string&) { return true; };
  return o;
}

struct Case {
  std::string id, reader, rspecifier, gt, status;
  size_t n = 0;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  std::ifstream in(KaldiDir() + "/CASES.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f.size() < 6) continue;
    out.push_back({f[0], f[1], f[2], f[3], f[4], static_cast<size_t>(std::stoul(f[5]))});
  }
  return out;
}

TEST(KaldiGolden, EveryCaseMatchesKaldi) {
  const std::vector<Case> cases = Cases();
  ASSERT_GE(cases.size(), 48u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    Gt gt = ReadGt(KaldiDir() + "/" + c.gt);
    if (c.id == "cm_empty_middle") {
      // Kaldi's key carries the 4 bytes its writer leaves after an empty CM; conveyor's does not
      // (EmptyCompressedMatrixLeftoverBytesAreNotAKey).
      for (GtEntry& e : gt.entries)
        if (e.key.rfind(std::string(4, '\0'), 0) == 0) e.key = e.key.substr(4);
    }
    ASSERT_EQ(gt.entries.size(), gt.count);
    ASSERT_EQ(gt.count, c.n);
    // Where conveyor reads what Kaldi refuses (see the file comment).
    const bool conveyor_reads_more = c.id == "bad_range_nocolrows" || c.id == "feats_nonfinite_text";
    auto strict = KaldiTable::Open(c.rspecifier, Options(c.reader));
    if (c.status == "ok" || conveyor_reads_more) {
      ASSERT_TRUE(strict.ok()) << strict.status();
    } else {
      ASSERT_FALSE(strict.ok()) << c.id << " should fail as Kaldi does";
      EXPECT_TRUE(absl::IsDataLoss(strict.status())) << strict.status();
      // The message names a file and where in it.
      EXPECT_TRUE(strict.status().message().find(".ark") != std::string::npos ||
                  strict.status().message().find(".scp:") != std::string::npos)
          << strict.status();
    }
    // Tolerating errors (maxErrors or `p`): exactly the entries Kaldi produced before its error.
    auto table = KaldiTable::Open(c.rspecifier, Options(c.reader, /*tolerate=*/true));
    ASSERT_TRUE(table.ok()) << table.status();
    const KaldiTable& t = **table;
    if (!conveyor_reads_more) {
      ASSERT_EQ(t.entries().size(), gt.entries.size());
    }
    for (size_t i = 0; i < gt.entries.size(); ++i) {
      if (c.reader == "dm") ExpectEntry<double>(t, i, gt.entries[i], c.id);
      else ExpectEntry<float>(t, i, gt.entries[i], c.id);
    }
  }
}

TEST(KaldiGolden, EmptyCompressedMatrixLeftoverBytesAreNotAKey) {
  // Kaldi reads the 4 bytes its writer leaves after an empty CM as the start of the next key
  // ("\0\0\0\0cmz03-after"); conveyor gives the key as written.
  Gt gt = ReadGt(KaldiDir() + "/gt/cm_empty_middle.gt");
  ASSERT_EQ(gt.entries.size(), 3u);
  auto table = KaldiTable::Open("ark:cm_empty_middle.ark", Options("fm"));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ((*table)->entries().size(), 3u);
  EXPECT_EQ(gt.entries[2].key.substr(0, 4), std::string(4, '\0'));
  gt.entries[2].key = gt.entries[2].key.substr(4);
  for (size_t i = 0; i < 3; ++i) ExpectEntry<float>(**table, i, gt.entries[i], "cm_empty_middle");
  auto last = KaldiTable::Open("ark:cm_empty_last.ark", Options("fm"));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->entries().size(), 2u);
}

TEST(KaldiGolden, ColumnRangeWithoutRowsReadsAsDocumented) {
  // `[,5:9]`: Kaldi's documentation allows it, its code refuses it; conveyor reads all rows.
  auto table = KaldiTable::Open("scp:bad_range_nocolrows.scp", Options("fm"));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ((*table)->entries().size(), 2u);
  const TableEntry& e = (*table)->entries()[1];
  EXPECT_EQ(e.key, "bad-line");
  EXPECT_EQ(e.window.row0, 0);
  EXPECT_EQ(e.window.col0, 5);
  EXPECT_EQ(e.window.cols, 5);
  // Against the whole matrix at the same offset, read from the archive (gt/feats.gt entry 0).
  Gt feats = ReadGt(KaldiDir() + "/gt/feats.gt");
  const GtEntry& whole = feats.entries[0];
  ASSERT_EQ(e.window.rows, whole.rows);
  std::vector<float> got(static_cast<size_t>(e.window.rows * 5));
  (*table)->Decode<float>(1, got.data());
  for (int64_t r = 0; r < whole.rows; ++r)
    for (int64_t c = 0; c < 5; ++c)
      ASSERT_TRUE(SameBits(got[r * 5 + c], ParseValue<float>(whole.values[r * whole.cols + 5 + c]))) << r << "," << c;
}

TEST(KaldiGolden, NegativeInfinityInTextReadsBack) {
  // Kaldi writes "-inf" in text archives but cannot read it; conveyor reads it.
  auto text = KaldiTable::Open("ark:feats_nonfinite_text.ark", Options("fm"));
  auto binary = KaldiTable::Open("ark:feats_nonfinite.ark", Options("fm"));
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_TRUE(binary.ok()) << binary.status();
  ASSERT_EQ((*text)->entries().size(), 2u);
  ASSERT_EQ((*binary)->entries().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Window& w = (*binary)->entries()[i].window;
    std::vector<float> a(static_cast<size_t>(w.rows * w.cols)), b(a.size());
    (*text)->Decode<float>(i, a.data());
    (*binary)->Decode<float>(i, b.data());
    int infs = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      if (std::isinf(b[k]) || std::isnan(b[k])) {
        ++infs;
        EXPECT_TRUE(std::isnan(b[k]) ? std::isnan(a[k]) : a[k] == b[k]) << k;
      }
    }
    EXPECT_GT(infs, 0);
  }
}

TEST(KaldiGolden, CompressedDecodeFormulasByHand) {
  // min -1, range 2: a percentile of 32768 -> -1 + 2*1.52590218966964e-05F*32768 in float.
  EXPECT_EQ(CompressedPercentileToFloat(-1.0f, 2.0f, 0), -1.0f);
  EXPECT_EQ(CompressedPercentileToFloat(-1.0f, 2.0f, 65535), -1.0f + 2.0f * 1.52590218966964e-05F * 65535.0f);
  // Byte 64 is exactly p25, 192 exactly p75, 255 exactly p100 (63/63).
  EXPECT_EQ(CompressedByteToFloat(0.f, 1.f, 3.f, 4.f, 0), 0.f);
  EXPECT_EQ(CompressedByteToFloat(0.f, 1.f, 3.f, 4.f, 64), 1.f);
  EXPECT_EQ(CompressedByteToFloat(0.f, 1.f, 3.f, 4.f, 192), 3.f);
  EXPECT_EQ(CompressedByteToFloat(0.f, 1.f, 3.f, 4.f, 255), 4.f);
  EXPECT_EQ(CompressedByteToFloat(0.f, 1.f, 3.f, 4.f, 128), 2.f);
}

// Long CM columns decode through a per-column table (vectorized, AVX2 where the CPU has it):
// every byte value, for many random percentile sets, gives exactly the per-value formula.
TEST(KaldiGolden, CompressedColumnTableEqualsTheFormulaBitForBit) {
  const int32_t rows = 256, cols = 64;
  std::string cm = std::string("\0BCM ", 5);
  auto put = [&](auto v) { cm.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(-3.5f), put(7.25f), put(rows), put(cols);
  uint32_t seed = 12345;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  std::vector<uint16_t> pct(4 * cols);
  for (int32_t c = 0; c < cols; ++c) {
    uint16_t q[4];
    for (auto& x : q) x = static_cast<uint16_t>(next() >> 16);
    std::sort(q, q + 4);
    for (int k = 0; k < 4; ++k) put(pct[4 * c + k] = q[k]);
  }
  for (int32_t c = 0; c < cols; ++c) {
    for (int32_t r = 0; r < rows; ++r) cm += static_cast<char>((r + 37 * c) & 255);
  }
  auto info = ScanObject(cm, 0, ObjectKind::kMatrix);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<float> out(rows * cols);
  DecodeMatrix<float>(cm, 0, *info, Window{0, rows, 0, cols}, out.data());
  for (int32_t c = 0; c < cols; ++c) {
    float p[4];
    for (int k = 0; k < 4; ++k) p[k] = CompressedPercentileToFloat(-3.5f, 7.25f, pct[4 * c + k]);
    for (int32_t r = 0; r < rows; ++r) {
      const float want = CompressedByteToFloat(p[0], p[1], p[2], p[3], static_cast<uint8_t>((r + 37 * c) & 255));
      ASSERT_EQ(std::memcmp(&out[r * cols + c], &want, 4), 0) << "column " << c << " byte " << ((r + 37 * c) & 255);
    }
  }
}

TEST(KaldiRspecifier, OptionsAndRefusals) {
  auto r = ParseRspecifier("ark,s,cs,o,p:foo.ark");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->scp);
  EXPECT_TRUE(r->sorted && r->called_sorted && r->once && r->permissive);
  EXPECT_EQ(r->rxfilename, "foo.ark");
  r = ParseRspecifier("scp,np,b,t:x.scp");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->scp);
  EXPECT_FALSE(r->permissive);
  EXPECT_FALSE(ParseRspecifier("foo.ark").ok());
  EXPECT_FALSE(ParseRspecifier("ark,scp:foo").ok());
  EXPECT_FALSE(ParseRspecifier("ark,zz:foo").ok());
  EXPECT_FALSE(ParseRspecifier("ark:").ok());
  EXPECT_FALSE(ParseRspecifier("ark:-").ok());
}

TEST(KaldiRange, ParseAndApply) {
  auto r = ParseMatrixRange("0:51");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->all_rows);
  EXPECT_TRUE(r->all_cols);
  for (const char* bad : {"a:b", "-1:5", "5:", "5:3", "", "1:2,3:4,5:6", "4", "3:10:2", "1:2,"}) {
    EXPECT_FALSE(ParseMatrixRange(bad).ok()) << bad;
  }
  for (const char* good : {":", ":,:", ",5:9", ":,5:9", "0:0,0:0"}) EXPECT_TRUE(ParseMatrixRange(good).ok()) << good;
  bool clamped;
  auto w = ApplyRange(*ParseMatrixRange("110:121"), 120, 40, &clamped);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(clamped);
  EXPECT_EQ(w->row0, 110);
  EXPECT_EQ(w->rows, 10);
  EXPECT_FALSE(ApplyRange(*ParseMatrixRange("0:123"), 120, 40, &clamped).ok());
  EXPECT_TRUE(ApplyRange(*ParseMatrixRange("0:122"), 120, 40, &clamped).ok());
  EXPECT_FALSE(ApplyRange(*ParseMatrixRange(":,0:40"), 120, 40, &clamped).ok());
}

TEST(KaldiTable, PipesOnlyWhenAllowed) {
  testing::TempDir dir;
  const std::string ark = testing::ReadFile(KaldiDir() + "/feats.ark");
  dir.Write("feats.ark", ark);
  TableOptions o = Options("fm");
  o.base_dir = dir.path();
  auto refused = KaldiTable::Open("ark:cat feats.ark |", o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("allowPipes"), std::string::npos) << refused.status();
  o.allow_pipes = true;
  auto piped = KaldiTable::Open("ark:cat " + dir.path() + "/feats.ark |", o);
  ASSERT_TRUE(piped.ok()) << piped.status();
  Gt gt = ReadGt(KaldiDir() + "/gt/feats.gt");
  ASSERT_EQ((*piped)->entries().size(), gt.entries.size());
  for (size_t i = 0; i < gt.entries.size(); ++i) ExpectEntry<float>(**piped, i, gt.entries[i], "pipe");
  // An scp line that is a command is refused the same way.
  dir.Write("p.scp", "u1 cat feats.ark |\n");
  o.allow_pipes = false;
  EXPECT_FALSE(KaldiTable::Open("scp:" + dir.path() + "/p.scp", o).ok());
}

TEST(KaldiTable, SortedOptionIsChecked) {
  TableOptions o = Options("fm");
  // feats.ark keys are sorted; mixed_concat's are not necessarily: build an unsorted scp.
  testing::TempDir dir;
  dir.Write("u.scp", "b " + KaldiDir() + "/feats.ark:14\na " + KaldiDir() + "/feats.ark:14\n");
  EXPECT_TRUE(KaldiTable::Open("scp:" + dir.path() + "/u.scp", o).ok());
  auto sorted = KaldiTable::Open("scp,s:" + dir.path() + "/u.scp", o);
  ASSERT_FALSE(sorted.ok());
  EXPECT_NE(sorted.status().message().find("sorted"), std::string::npos);
}

TEST(KaldiTable, VectorsBinaryAndText) {
  testing::TempDir dir;
  std::string ark;
  auto put32 = [&](int32_t v) {
    ark.push_back(4);
    ark.append(reinterpret_cast<const char*>(&v), 4);
  };
  ark += "v1 ";
  ark += std::string("\0B", 2) + "FV ";
  put32(3);
  for (float f : {1.5f, -2.0f, 3.25f}) ark.append(reinterpret_cast<const char*>(&f), 4);
  ark += "v2 ";
  ark += std::string("\0B", 2) + "DV ";
  put32(2);
  for (double d : {0.1, 1e300}) ark.append(reinterpret_cast<const char*>(&d), 8);
  ark += "v3  [ 4 5 6 ]\n";
  ark += "v4  [ ]\n";
  dir.Write("v.ark", ark);
  TableOptions o = Options("fm");
  o.kind = ObjectKind::kVector;
  auto t = KaldiTable::Open("ark:" + dir.path() + "/v.ark", o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*t)->entries().size(), 4u);
  std::vector<double> v(3);
  (*t)->Decode<double>(0, v.data());
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.0, 3.25}));
  std::vector<float> f(2);
  (*t)->Decode<float>(1, f.data());
  EXPECT_EQ(f[0], static_cast<float>(0.1));
  EXPECT_TRUE(std::isinf(f[1]));  // (float)1e300, as Kaldi's cross-type read gives
  (*t)->Decode<double>(2, v.data());
  EXPECT_EQ(v, (std::vector<double>{4, 5, 6}));
  EXPECT_EQ((*t)->entries()[3].info.cols, 0);
}

TEST(KaldiTable, EveryTruncationIsAnErrorOrAPrefix) {
  // Every prefix of a mixed archive (FM, text, CM, CM2, CM3, DM) either reads as a prefix of
  // its entries or fails with DataLoss naming the file and a byte offset; never a crash.
  const std::string whole = testing::ReadFile(KaldiDir() + "/mixed_concat.ark");
  testing::TempDir dir;
  auto full = KaldiTable::Open("ark:" + KaldiDir() + "/mixed_concat.ark", Options("fm"));
  ASSERT_TRUE(full.ok());
  for (size_t n = 0; n < whole.size(); n += n < 4096 ? 1 : 997) {
    const std::string path = dir.Write("t.ark", whole.substr(0, n));
    auto t = KaldiTable::Open("ark:" + path, Options("fm"));
    if (t.ok()) {
      ASSERT_LE((*t)->entries().size(), (*full)->entries().size());
      for (size_t i = 0; i < (*t)->entries().size(); ++i) {
        const Window& w = (*t)->entries()[i].window;
        std::vector<float> a(static_cast<size_t>(w.rows * w.cols));
        (*t)->Decode<float>(i, a.data());
      }
    } else {
      EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
      EXPECT_NE(t.status().message().find("t.ark: byte "), std::string::npos) << t.status();
    }
  }
}

}  // namespace
}  // namespace conveyor::kaldi
