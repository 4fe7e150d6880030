// KaldiTable datasets through the real loader: the dump of Kaldi features joined with
// alignments equals one built independently from Kaldi's own decodings (gt/*.gt); keys
// missing on one side, frame-count mismatches, empty entries, one-hot labels out of range and
// dims that disagree are skipped and counted, or are errors when maxErrors says so.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/batch/dump_writer.h"
#include "common/config/config_loader.h"
#include "common/batch/assembler.h"
#include "common/dataset/dataset.h"
#include "common/sampling/loader.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string KaldiDir() { return TestdataDir() + "/kaldi"; }

struct GtMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<std::string> values;
};

// key -> values, in file order.
std::vector<std::pair<std::string, GtMatrix>> ReadGt(const std::string& name) {
  std::vector<std::pair<std::string, GtMatrix>> out;
  std::ifstream in(KaldiDir() + "/gt/" + name);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string key, type;
    GtMatrix m;
    ss >> key >> type;
    if (type == "iv") {
      ss >> m.cols;
      m.rows = m.cols;  // one sample per element
      m.cols = 1;
    } else {
      ss >> m.rows >> m.cols;
    }
    std::string v;
    while (ss >> v) m.values.push_back(v);
    out.emplace_back(key, m);
  }
  return out;
}

std::string Number(const std::string& gt_value) {
  std::string s;
  AppendNumber(std::strtof(gt_value.c_str(), nullptr), &s);
  return s;
}

absl::StatusOr<DatasetConfig> Config(const TempDir& dir, const std::string& yaml) {
  const std::string path = dir.Write("conveyor.yaml", yaml);
  auto config = LoadConfigFile(path);
  if (!config.ok()) return config.status();
  return config->datasets[0];
}

TEST(KaldiDataset, FeaturesJoinedWithAlignmentsDumpAsKaldiReadsThem) {
  TempDir dir;
  auto config = Config(dir, absl::StrCat(R"(
datasets:
  speech:
    randomize: false
    deserializers:
      - type: KaldiTable
        rspecifier: "scp:)", KaldiDir(), R"(/feats.scp"
        input: {features: {dim: 40}}
      - type: KaldiTable
        rspecifier: "ark:)", KaldiDir(), R"(/ali.ark"
        kind: int32-vector
        input: {labels: {format: ids}}
)"));
  ASSERT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = 1000000;  // one batch: the dump is in file order
  auto dump = DumpDataset(*config, ro);
  ASSERT_TRUE(dump.ok()) << dump.status();
  // The expected dump, from Kaldi's own decodings.
  const auto feats = ReadGt("feats.gt");
  const auto ali = ReadGt("ali.gt");
  ASSERT_EQ(feats.size(), 50u);
  ASSERT_EQ(ali.size(), 50u);
  std::string want;
  for (size_t i = 0; i < feats.size(); ++i) {
    ASSERT_EQ(feats[i].first, ali[i].first);
    const GtMatrix& f = feats[i].second;
    const GtMatrix& a = ali[i].second;
    ASSERT_EQ(f.rows, a.rows) << feats[i].first;
    absl::StrAppend(&want, "{\"epoch\":0,\"batch\":0,\"key\":\"", feats[i].first, "\",\"streams\":{\"features\":{\"dense\":[");
    for (int64_t r = 0; r < f.rows; ++r) {
      want += r ? ",[" : "[";
      for (int64_t c = 0; c < f.cols; ++c) absl::StrAppend(&want, c ? "," : "", Number(f.values[r * f.cols + c]));
      want += "]";
    }
    want += "]},\"labels\":{\"ids\":[";
    for (int64_t r = 0; r < a.rows; ++r) absl::StrAppend(&want, r ? "," : "", "[", a.values[r], "]");
    want += "]}}}\n";
  }
  EXPECT_EQ(*dump, want);
}

TEST(KaldiDataset, CompressedTextDoubleAndRangesThroughTheLoader) {
  // Every fm case's values arrive in batches exactly as the table decodes them: sum check
  // over a randomized, multi-batch epoch against gt (order-independent).
  TempDir dir;
  for (const char* name : {"cm_auto", "cm_2byte_auto", "cm_1byte_auto", "feats_text", "feats_double_as_float", "feats"}) {
    SCOPED_TRACE(name);
    const std::string ark = std::string(name) == "feats_double_as_float" ? "feats_double" : name;
    auto config = Config(dir, absl::StrCat(R"(
datasets:
  d:
    randomize: true
    deserializers:
      - type: KaldiTable
        rspecifier: "ark:)", KaldiDir(), "/", ark, R"(.ark"
        chunkSizeInBytes: 20000
        input: {features: {}}
)"));
    ASSERT_TRUE(config.ok()) << config.status();
    ReadOptions ro;
    ro.minibatch_size = 256;
    ro.request.seed = 5;
    auto dump = DumpDataset(*config, ro);
    ASSERT_TRUE(dump.ok()) << dump.status();
    std::map<std::string, std::string> got;
    std::istringstream in(*dump);
    std::string line;
    while (std::getline(in, line)) {
      const size_t k = line.find("\"key\":\"") + 7;
      const std::string key = line.substr(k, line.find('"', k) - k);
      const size_t d = line.find("\"dense\":[") + 9;
      got[key] = line.substr(d, line.rfind("]}}}") - d);
    }
    const auto gt = ReadGt(std::string(name) + ".gt");
    size_t delivered = 0;
    for (const auto& [key, m] : gt) {
      if (m.rows == 0) continue;
      ++delivered;
      std::string want;
      for (int64_t r = 0; r < m.rows; ++r) {
        want += r ? ",[" : "[";
        for (int64_t c = 0; c < m.cols; ++c) absl::StrAppend(&want, c ? "," : "", Number(m.values[r * m.cols + c]));
        want += "]";
      }
      ASSERT_EQ(got[key], want) << key;
    }
    EXPECT_EQ(got.size(), delivered);
  }
}

// Datasets opened with compressed_in_place keep CM, CM2 and CM3 matrices compressed in their
// chunks (for the CUDA assembler to decode on the device); the CPU assembler decodes them as
// it copies. Every batch is the one decoding at parse time gives: utterances and frames,
// randomized, float and double, whole matrices and scp row/column ranges, every CM case of
// tests/data/kaldi (1-byte CM with all its column-header forms, CM2, CM3, edge shapes).
TEST(KaldiDataset, CompressedMatricesLeftCompressedDeliverTheSameBatches) {
  TempDir dir;
  // Ranges into cm_auto.ark: rows, columns, both (its matrices are 40 wide).
  const std::string ranges = dir.Write("ranges.scp", absl::StrCat(
      "r1 ", KaldiDir(), "/cm_auto.ark:14[2:10,0:39]\n",
      "r2 ", KaldiDir(), "/cm_auto.ark:1169[0:30,0:39]\n",
      "r3 ", KaldiDir(), "/cm_auto.ark:6084[5:5,0:39]\n"));
  const std::string ranged_cols = dir.Write("cols.scp", absl::StrCat(
      "c1 ", KaldiDir(), "/cm_auto.ark:14[:,3:12]\n",
      "c2 ", KaldiDir(), "/cm_auto.ark:1169[4:20,3:12]\n"));
  struct Case {
    std::string rspecifier;
    std::string extra;  // dataset keys
  };
  std::vector<Case> cases;
  for (const char* name : {"cm_auto", "cm_2byte_auto", "cm_1byte_auto", "cm_1byte_01", "cm_1byte_uint", "cm_2byte_int",
                           "cm_edge", "cm_speech"}) {
    cases.push_back({absl::StrCat("scp:", KaldiDir(), "/", name, ".scp"), ""});
  }
  cases.push_back({"scp:" + ranges, ""});
  cases.push_back({"scp:" + ranged_cols, ""});
  cases.push_back({absl::StrCat("scp:", KaldiDir(), "/cm_speech.scp"), "    precision: double\n"});
  for (const Case& c : cases) {
    for (bool frames : {false, true}) {
      SCOPED_TRACE(c.rspecifier + c.extra + (frames ? " frames" : " utterances"));
      // Read as frames by request: a dataset configured for frames is not kept compressed.
      auto config = Config(dir, absl::StrCat("datasets:\n  d:\n    randomize: true\n    maxErrors: 100000\n", c.extra, R"(
    deserializers:
      - type: KaldiTable
        rspecifier: ")", c.rspecifier, R"("
        chunkSizeInBytes: 4000
        input: {features: {}}
)"));
      ASSERT_TRUE(config.ok()) << config.status();
      ReadOptions ro;
      ro.minibatch_size = frames ? 64 : 200;
      ro.request.seed = 9;
      ro.request.frame_mode = frames;
      auto decoded = DumpDataset(*config, ro);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      ro.compressed_in_place = true;
      auto kept = DumpDataset(*config, ro);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_GT(decoded->size(), 100u);
      EXPECT_TRUE(*kept == *decoded) << "first difference at byte "
                                     << std::mismatch(kept->begin(), kept->end(), decoded->begin(), decoded->end()).first -
                                            kept->begin();
      // The chunks really are compressed (else the comparison above proves nothing).
      DatasetOpenOptions oo;
      oo.compressed_in_place = true;
      oo.diagnostics_sink = [](Severity, const std::string&) {};  // the skipped entries, said above
      auto ds = Dataset::Open(*config, oo);
      ASSERT_TRUE(ds.ok()) << ds.status();
      auto chunk = (*ds)->SharedChunk(0);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      EXPECT_FALSE((*chunk)->streams[0].compressed.empty());
      EXPECT_TRUE((*chunk)->streams[0].values_f32.empty() && (*chunk)->streams[0].values_f64.empty());
      DatasetConfig frames_config = *config;
      frames_config.frame_mode = true;
      auto decoding = Dataset::Open(frames_config, oo);
      ASSERT_TRUE(decoding.ok()) << decoding.status();
      EXPECT_FALSE((*decoding)->compressed_in_place());
    }
  }
}

// Binary FM (float datasets) and DM (double datasets) are not decoded: the chunk points at
// their rows in the mapped archive. Anything else in a chunk (CM, text, the other
// precision, a column range) makes that chunk decode.
TEST(KaldiDataset, PlainMatricesAreUsedWhereTheyLie) {
  TempDir dir;
  struct Case {
    const char* rspecifier;
    const char* precision;
    bool in_place;
  };
  for (const Case& c : {Case{"ark:feats.ark", "float", true}, Case{"ark:feats_double.ark", "double", true},
                        Case{"ark:feats_double.ark", "float", false}, Case{"ark:feats.ark", "double", false},
                        Case{"ark:cm_auto.ark", "float", false}, Case{"ark:feats_text.ark", "float", false},
                        Case{"scp:feats_ranges.scp", "float", false}}) {
    SCOPED_TRACE(absl::StrCat(c.rspecifier, " ", c.precision));
    auto config = Config(dir, absl::StrCat("datasets:\n  d:\n    precision: ", c.precision,
                                           "\n    deserializers:\n      - type: KaldiTable\n        rspecifier: \"",
                                           c.rspecifier, "\"\n        input: {features: {}}\n"));
    ASSERT_TRUE(config.ok()) << config.status();
    config->deserializers[0].base_dir = KaldiDir();
    config->max_errors = 1000;
    auto ds = Dataset::Open(*config);
    ASSERT_TRUE(ds.ok()) << ds.status();
    auto chunk = (*ds)->ParseChunk(0);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const ParsedStream& ps = (*chunk)->streams[0];
    EXPECT_EQ(ps.in_place.empty(), !c.in_place);
    EXPECT_EQ(ps.values_f32.empty() && ps.values_f64.empty(), c.in_place);
  }  // One chunk holding binary and text matrices: decoded, every value where it belongs.
  auto fm = [](const std::string& key, std::vector<float> v) {
    std::string out = key + " " + std::string("\0BFM ", 5);
    const int32_t rows = 2, cols = 3;
    out += '\4';
    out.append(reinterpret_cast<const char*>(&rows), 4);
    out += '\4';
    out.append(reinterpret_cast<const char*>(&cols), 4);
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    return out;
  };
  const std::string ark = dir.Write("mixed.ark", fm("a", {1, 2, 3, 4, 5, 6}) + "b  [\n 7 8 9\n 10 11 12 ]\n" +
                                                     fm("c", {13, 14, 15, 16, 17, 18}));
  auto config = Config(dir, "datasets:\n  d:\n    randomize: false\n    deserializers:\n      - type: KaldiTable\n"
                            "        rspecifier: \"ark:" + ark + "\"\n        input: {features: {}}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = 100;
  auto dump = DumpDataset(*config, ro);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_NE(dump->find("\"key\":\"a\",\"streams\":{\"features\":{\"dense\":[[1,2,3],[4,5,6]]}}"), std::string::npos) << *dump;
  EXPECT_NE(dump->find("\"key\":\"b\",\"streams\":{\"features\":{\"dense\":[[7,8,9],[10,11,12]]}}"), std::string::npos);
  EXPECT_NE(dump->find("\"key\":\"c\",\"streams\":{\"features\":{\"dense\":[[13,14,15],[16,17,18]]}}"), std::string::npos);
}

// 24 utterances of 64 x 40 float matrices (10 KB each: a few pages), values u * 10000 + i
// + `offset`, as Kaldi writes a binary archive.
constexpr int32_t kArkRows = 64, kArkCols = 40;
std::string FeatsArk(float offset = 0) {
  std::string ark;
  for (int u = 0; u < 24; ++u) {
    ark += "utt" + std::to_string(u) + " " + std::string("\0BFM ", 5);
    ark += '\4';
    ark.append(reinterpret_cast<const char*>(&kArkRows), 4);
    ark += '\4';
    ark.append(reinterpret_cast<const char*>(&kArkCols), 4);
    for (int i = 0; i < kArkRows * kArkCols; ++i) {
      const float v = offset + static_cast<float>(u * 10000 + i);
      ark.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return ark;
}

// A dataset of the archive at `path` in 64 KiB chunks, file order.
absl::StatusOr<DatasetConfig> ArkConfig(const TempDir& dir, const std::string& path) {
  return Config(dir, "datasets:\n  d:\n    randomize: false\n    deserializers:\n      - type: KaldiTable\n"
                     "        chunkSizeInBytes: 65536\n        rspecifier: \"ark:" + path +
                     "\"\n        input: {features: {}}\n");
}

// An ark rewritten or cut short while a dataset reads it (a feature file regenerated in place):
// Kaldi matrices are read through the file's mapping, where a read past the new end raised
// SIGBUS and ended the daemon. Now the parse of a chunk past the cut, and a batch assembled
// from a chunk parsed before it (plain matrices are used where they lie), are DataLoss naming
// the file, and the process goes on.
TEST(KaldiDataset, AnArkCutShortWhileReadIsAnErrorNamingItNotACrash) {
  TempDir dir;
  const int32_t rows = kArkRows, cols = kArkCols;
  const std::string path = dir.Write("feats.ark", FeatsArk());
  auto config = ArkConfig(dir, path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(*config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const uint64_t chunks = (*ds)->index().chunks.size();
  ASSERT_GE(chunks, 3u);
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = rows;  // one utterance a batch
  auto loader = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(loader.ok()) << loader.status();
  Batch b;
  auto more = (*loader)->Next(&b);  // chunk 0 parsed (its matrices where they lie) and batch 0
  ASSERT_TRUE(more.ok() && *more) << more.status();
  std::vector<float> utt0(rows * cols);  // batch 0 holds utterance 0's values, as written
  for (int i = 0; i < rows * cols; ++i) utt0[i] = static_cast<float>(i);
  const std::string_view batch(reinterpret_cast<const char*>(b.bytes.data()), b.bytes.size());
  EXPECT_NE(batch.find(std::string_view(reinterpret_cast<const char*>(utt0.data()), utt0.size() * 4)), std::string::npos);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);  // the rest of chunk 0 and every later chunk gone
  // Batch 1 is utterance 1 of chunk 0, parsed before the cut and read where it lay.
  more = (*loader)->Next(&b);
  const absl::Status st = more.status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(path + ": the file was cut short after it was opened"), std::string::npos) << st;
  EXPECT_NE(st.message().find("changed or truncated since"), std::string::npos) << st;
  // The last chunk, parsed now: the same error; the dataset stays failed, it does not serve zeros.
  auto last = (*ds)->ParseChunk(chunks - 1);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kDataLoss) << last.status();
  EXPECT_EQ((*ds)->CheckReads().code(), absl::StatusCode::kDataLoss);
}

// An archive rewritten in place while its dataset is open (a Kaldi recipe's stage run again:
// `copy-feats ... ark:feats.ark` truncates and rewrites the same path): the next chunk parsed
// is DataLoss naming the archive, never the new file's values at the old index's offsets; and
// a cut inside the last page (no SIGBUS: the page's tail reads as zeros) is caught the same way.
TEST(KaldiDataset, AnArkChangedInPlaceWhileOpenIsAnErrorNamingIt) {
  for (const bool cut : {false, true}) {
    SCOPED_TRACE(cut ? "cut inside its last page" : "rewritten with its size kept");
    TempDir dir;
    const std::string ark = FeatsArk();
    const std::string path = dir.Write("feats.ark", ark);
    auto config = ArkConfig(dir, path);
    ASSERT_TRUE(config.ok()) << config.status();
    auto ds = Dataset::Open(*config);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const uint64_t chunks = (*ds)->index().chunks.size();
    ASSERT_GE(chunks, 3u);
    ASSERT_TRUE((*ds)->ParseChunk(0).ok());
    if (cut) {
      // 100 bytes short: the last page stays mapped, its tail reads as zeros.
      ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(ark.size() - 100)), 0);
    } else {
      const std::string changed = FeatsArk(0.5f);
      ASSERT_EQ(changed.size(), ark.size());
      ASSERT_EQ(RewriteInPlace(path, changed), absl::OkStatus());
    }
    for (uint64_t c : {uint64_t{1}, chunks - 1}) {
      auto chunk = (*ds)->ParseChunk(c);
      ASSERT_FALSE(chunk.ok()) << "chunk " << c;
      EXPECT_EQ(chunk.status().code(), absl::StatusCode::kDataLoss) << chunk.status();
      EXPECT_NE(chunk.status().message().find(path + ": the file was changed after it was opened (" +
                                              std::to_string(ark.size()) + " bytes"),
                std::string::npos)
          << chunk.status();
    }
  }
  // Replaced the documented way (a new archive renamed over the path): the open dataset goes on
  // reading the archive it opened, unchanged.
  TempDir dir;
  const std::string path = dir.Write("feats.ark", FeatsArk());
  auto config = ArkConfig(dir, path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(*config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const std::string fresh = dir.Write("fresh.ark", FeatsArk(0.5f));
  ASSERT_EQ(std::rename(fresh.c_str(), path.c_str()), 0);
  for (uint64_t c = 0; c < (*ds)->index().chunks.size(); ++c) {
    auto chunk = (*ds)->ParseChunk(c);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
  }
}

TEST(KaldiDataset, MissingKeysMismatchesAndEmptyEntriesAreSkippedAndCounted) {
  TempDir dir;
  // Alignments: utt0001 missing, utt0002 one frame short, the rest from ali.ark as text.
  const auto ali = ReadGt("ali.gt");
  std::string text;
  for (size_t i = 1; i < ali.size(); ++i) {
    text += ali[i].first + " ";
    const size_t n = ali[i].second.values.size() - (i == 1 ? 1 : 0);
    for (size_t k = 0; k < n; ++k) text += ali[i].second.values[k] + " ";
    text += "\n";
  }
  text += "extra-utt 1 2 3 \n";
  dir.Write("ali.txt.ark", text);
  // Features: feats_edge.ark has an empty matrix; appended to a copy of feats.scp.
  for (bool frame_mode : {false, true}) {
    SCOPED_TRACE(frame_mode);
    auto config = Config(dir, absl::StrCat(R"(
datasets:
  speech:
    randomize: false
    frameMode: )", frame_mode ? "true" : "false", R"(
    deserializers:
      - type: KaldiTable
        rspecifier: "scp:)", KaldiDir(), R"(/feats.scp"
        input: {features: {dim: 40}}
      - type: KaldiTable
        rspecifier: "ark,t:ali.txt.ark"
        kind: int32-vector
        input: {labels: {format: sparse, dim: 5000}}
)"));
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<std::string> messages;
    DatasetOpenOptions oo;
    oo.diagnostics_sink = [&](Severity, const std::string& m) { messages.push_back(m); };
    auto ds = Dataset::Open(*config, oo);
    ASSERT_TRUE(ds.ok()) << ds.status();
    ASSERT_EQ((*ds)->source_stats().size(), 2u);
    EXPECT_EQ((*ds)->source_stats()[0].entries, 50u);
    EXPECT_EQ((*ds)->source_stats()[1].entries, 50u);
    EXPECT_EQ((*ds)->source_stats()[1].missing, 1u);
    EXPECT_EQ((*ds)->dropped_mismatched(), frame_mode ? 1u : 0u);
    EXPECT_EQ((*ds)->index().sequences.size(), frame_mode ? 48u : 49u);
    EXPECT_EQ((*ds)->index().names[0], frame_mode ? "spk01-utt0003" : "spk01-utt0002");
    bool told = false;
    for (const std::string& m : messages) told = told || m.find("has no entry 'spk01-utt0001'") != std::string::npos;
    EXPECT_TRUE(told);
    // One-hot labels: every sample one entry of value 1 at its label.
    ReadOptions ro;
    ro.minibatch_size = 100000;
    auto dump = DumpDataset(*config, ro);
    ASSERT_TRUE(dump.ok()) << dump.status();
    const std::string first_label = ali[frame_mode ? 2 : 1].second.values[0];
    EXPECT_NE(dump->find(absl::StrCat("\"labels\":{\"sparse\":[[[", first_label, ",1]]")), std::string::npos);
  }
  // An empty matrix (feats_edge: fe01-empty) is not delivered, and counted.
  auto edge = Config(dir, absl::StrCat(R"(
datasets:
  e:
    deserializers:
      - type: KaldiTable
        rspecifier: "ark:)", KaldiDir(), R"(/feats_edge.ark"
        input: {x: {}}
)"));
  ASSERT_TRUE(edge.ok()) << edge.status();
  // Dims differ across feats_edge (1, 40, 1000, 1, 8): with no dim the first entry's wins
  // and the others are errors; maxErrors lets them be skipped.
  auto strict = Dataset::Open(*edge);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("fe03-1x40"), std::string::npos) << strict.status();
  edge->max_errors = 10;
  auto tolerant = Dataset::Open(*edge, DatasetOpenOptions{0, nullptr, [](Severity, const std::string&) {}, std::nullopt});
  ASSERT_TRUE(tolerant.ok()) << tolerant.status();
  EXPECT_EQ((*tolerant)->dropped_empty(), 1u);
  EXPECT_EQ((*tolerant)->source_stats()[0].skipped, 3u);  // 1x40, 3x1000, 2x8 (dim 1 from 1x1)
  EXPECT_EQ((*tolerant)->index().sequences.size(), 2u);  // fe02-1x1, fe05-tall
}

TEST(KaldiDataset, LabelsOutsideTheirDimAreErrors) {
  TempDir dir;
  dir.Write("a.ark", "u1 0 1 2 \nu2 0 7 1 \nu3 3 \n");
  auto config = Config(dir, R"(
datasets:
  a:
    deserializers:
      - type: KaldiTable
        rspecifier: "ark:a.ark"
        kind: int32-vector
        input: {labels: {format: sparse, dim: 5}}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  auto strict = Dataset::Open(*config);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("'u2': label 7 at position 1 is outside [0, 5)"), std::string::npos) << strict.status();
  config->max_errors = 1;
  auto tolerant = Dataset::Open(*config, DatasetOpenOptions{0, nullptr, [](Severity, const std::string&) {}, std::nullopt});
  ASSERT_TRUE(tolerant.ok()) << tolerant.status();
  EXPECT_EQ((*tolerant)->index().names, (std::vector<std::string>{"u1", "u3"}));
}

TEST(KaldiDataset, ConfigurationIsChecked) {
  TempDir dir;
  auto bad = [&](const std::string& body) {
    auto c = ParseConfig(absl::StrCat("datasets:\n  d:\n    deserializers:\n      - type: KaldiTable\n", body), "c.yaml", dir.path());
    EXPECT_FALSE(c.ok()) << body;
    return c.ok() ? std::string() : std::string(c.status().message());
  };
  EXPECT_NE(bad("        input: {x: {}}\n").find("needs 'rspecifier'"), std::string::npos);
  EXPECT_NE(bad("        rspecifier: \"ark:a\"\n        input: {x: {}, y: {}}\n").find("exactly one stream"), std::string::npos);
  EXPECT_NE(bad("        rspecifier: \"ark:a\"\n        input: {x: {format: sparse, dim: 3}}\n").find("dense"), std::string::npos);
  EXPECT_NE(bad("        rspecifier: \"ark:a\"\n        kind: int32-vector\n        input: {x: {format: sparse}}\n").find("need 'dim'"),
            std::string::npos);
  EXPECT_NE(bad("        rspecifier: \"ark:a\"\n        kind: tensor\n        input: {x: {}}\n").find("expected kind"), std::string::npos);
  EXPECT_NE(bad("        file: a.ark\n        rspecifier: \"ark:a\"\n        input: {x: {}}\n").find("not 'file'"), std::string::npos);
  // Pipes are refused unless allowed, and then run.
  const std::string ark = ReadFile(KaldiDir() + "/feats.ark");
  dir.Write("feats.ark", ark);
  const std::string yaml = absl::StrCat("datasets:\n  d:\n    deserializers:\n      - type: KaldiTable\n        rspecifier: \"ark:cat ",
                                        dir.path(), "/feats.ark |\"\n        input: {x: {dim: 40}}\n");
  auto c = ParseConfig(yaml, "c.yaml", dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  auto refused = Dataset::Open(c->datasets[0]);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("allowPipes: true"), std::string::npos) << refused.status();
  c->datasets[0].allow_pipes = true;
  auto piped = Dataset::Open(c->datasets[0]);
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ((*piped)->index().sequences.size(), 50u);
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// docs/formats.md, "Relative paths": an scp entry's relative file is looked for in the
// configuration's directory first, then in the scp file's directory.
TEST(KaldiDataset, RelativeScpPathsResolveAgainstTheConfigThenTheScpDirectory) {
  TempDir dir;
  ::mkdir((dir.path() + "/recipe").c_str(), 0700);
  ::mkdir((dir.path() + "/recipe/data").c_str(), 0700);
  ::mkdir((dir.path() + "/lists").c_str(), 0700);
  const std::string ark = ReadFile(KaldiDir() + "/feats.ark");
  dir.Write("recipe/data/in_recipe.ark", ark);  // relative to the configuration (a recipe dir)
  dir.Write("lists/beside.ark", ark);           // beside the scp file
  // The first utterance of feats.scp, by offset, through both rules.
  const std::string first = ReadFile(KaldiDir() + "/feats.scp");
  const std::string offset = first.substr(first.find(':') + 1, first.find('\n') - first.find(':') - 1);
  dir.Write("lists/feats.scp", "a data/in_recipe.ark:" + offset + "\nb beside.ark:" + offset + "\n");
  const std::string yaml = "datasets:\n  s:\n    randomize: false\n    deserializers:\n      - type: KaldiTable\n"
                           "        rspecifier: \"scp:../lists/feats.scp\"\n        input: {f: {dim: 40}}\n";
  const std::string path = dir.Write("recipe/conveyor.yaml", yaml);
  auto config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = 1000000;
  auto dump = DumpDataset(config->datasets[0], ro);
  ASSERT_TRUE(dump.ok()) << dump.status();
  const size_t newline = dump->find('\n');
  ASSERT_NE(newline, std::string::npos);
  std::string a = dump->substr(0, newline), b = dump->substr(newline + 1);
  ASSERT_FALSE(b.empty());
  b.pop_back();
  EXPECT_EQ(a.substr(a.find("streams")), b.substr(b.find("streams")));  // the same matrix both ways
  EXPECT_NE(a.find("\"key\":\"a\""), std::string::npos);
}

TEST(KaldiDataset, AnScpWhoseFilesAreAllMissingIsOneErrorNamingTheRule) {
  TempDir dir;
  dir.Write("feats.scp", "u1 nowhere/a.ark:5\nu2 nowhere/a.ark:99\nu3 /absent/b.ark:1\n");
  // Permissive (`p`): each unreadable line would be a skipped warning; all of them is an error.
  auto config = Config(dir, "datasets:\n  s:\n    deserializers:\n      - type: KaldiTable\n"
                            "        rspecifier: \"scp,p:feats.scp\"\n        input: {f: {dim: 40}}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(*config, {});
  ASSERT_FALSE(ds.ok());
  const std::string message(ds.status().message());
  EXPECT_NE(message.find("feats.scp: none of the files its entries name could be opened (3 entries; the first: "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("looked for in the configuration's directory"), std::string::npos) << message;
  // One readable entry among unreadable ones: the table opens with what it can read.
  dir.Write("feats.scp", "u1 nowhere/a.ark:5\nu2 " + KaldiDir() + "/feats.ark:14\n");
  auto partial = Config(dir, absl::StrCat("datasets:\n  s:\n    deserializers:\n      - type: KaldiTable\n"
                                          "        rspecifier: \"scp,p:feats.scp\"\n        input: {f: {dim: 40}}\n"));
  ASSERT_TRUE(partial.ok());
  auto opened = Dataset::Open(*partial, {});
  EXPECT_TRUE(opened.ok()) << opened.status();
}

}  // namespace
}  // namespace conveyor::testing
