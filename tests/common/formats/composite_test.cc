// Composite datasets with CNTKTextFormat and CNTKBinary deserializers: sequences joined by
// key (a file's sequence ids as decimal text) in the first deserializer's order, a key the
// other side lacks skipped and counted; the expected dumps are written out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/config_loader.h"
#include "common/convert/cbf_writer.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

absl::StatusOr<DatasetConfig> Config(const TempDir& dir, const std::string& yaml) {
  auto config = LoadConfigFile(dir.Write("conveyor.yaml", yaml));
  if (!config.ok()) return config.status();
  return config->datasets[0];
}

std::string Line(const std::string& key, const std::string& streams) {
  return absl::StrCat("{\"epoch\":0,\"batch\":0,\"key\":\"", key, "\",\"streams\":{", streams, "}}\n");
}

// A dataset of two CTF files joined by id: `x` (dense, dim 2) from `feats`, `y` (sparse,
// dim `label_dim`) from `labels`; `dataset` and `per_file` are extra YAML lines (indented).
absl::StatusOr<DatasetConfig> TwoFiles(const TempDir& dir, const std::string& feats, const std::string& labels,
                                       const std::string& dataset, const std::string& feats_extra = "",
                                       const std::string& labels_extra = "", int label_dim = 5) {
  return Config(dir, absl::StrCat("datasets:\n  d:\n", dataset, "    deserializers:\n"
                                  "      - type: CNTKTextFormat\n        file: ", feats, "\n", feats_extra,
                                  "        input: {x: {dim: 2, format: dense}}\n"
                                  "      - type: CNTKTextFormat\n        file: ", labels, "\n", labels_extra,
                                  "        input: {y: {dim: ", label_dim, ", format: sparse}}\n"));
}

TEST(Composite, TextFilesJoinedByIdInThePrimarysOrder) {
  TempDir dir;
  const std::string feats = dir.Write("feats.ctf", "3 |x 1 2\n3 |x 3 4\n1 |x 5 6\n7 |x 7 8\n");
  const std::string labels = dir.Write("labels.ctf", "7 |y 2:1\n3 |y 0:1\n3 |y 4:0.5\n9 |y 1:1\n");
  auto config = TwoFiles(dir, feats, labels, "    randomize: false\n");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<std::string> messages;
  DatasetOpenOptions oo;
  oo.diagnostics_sink = [&](Severity, const std::string& m) { messages.push_back(m); };
  auto ds = Dataset::Open(*config, oo);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->source_stats().size(), 2u);
  EXPECT_EQ((*ds)->source_stats()[0].entries, 3u);
  EXPECT_EQ((*ds)->source_stats()[1].entries, 3u);
  EXPECT_EQ((*ds)->source_stats()[1].missing, 1u);  // id 1; id 9 has no features and is never asked for
  bool told = false;
  for (const std::string& m : messages) told = told || m.find("has no entry '1'") != std::string::npos;
  EXPECT_TRUE(told);
  auto dump = DumpDataset(*config, ReadOptions());
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(*dump, Line("3", "\"x\":{\"dense\":[[1,2],[3,4]]},\"y\":{\"sparse\":[[[0,1]],[[4,0.5]]]}") +
                       Line("7", "\"x\":{\"dense\":[[7,8]]},\"y\":{\"sparse\":[[[2,1]]]}"));
}

TEST(Composite, BinaryFileJoinedWithKaldiAlignments) {
  TempDir dir;
  // The CBF file: sequences 0, 1, 2 (CBF keys sequences by their index).
  const std::string text = dir.Write("feats.ctf", "0 |x 1 2\n1 |x 3 4\n1 |x 5 6\n2 |x 7 8\n");
  auto text_config = Config(dir, absl::StrCat("datasets:\n  t:\n    randomize: false\n    deserializers:\n"
                                              "      - type: CNTKTextFormat\n        file: ", text,
                                              "\n        input: {x: {dim: 2, format: dense}}\n"));
  ASSERT_TRUE(text_config.ok()) << text_config.status();
  auto text_ds = Dataset::Open(*text_config);
  ASSERT_TRUE(text_ds.ok()) << text_ds.status();
  const std::string cbf = dir.path() + "/feats.cbf";
  ASSERT_TRUE(WriteCbf(**text_ds, cbf, {}).ok());
  // Alignments (primary) name sequences 2 and 1, in that order; 5 is not in the CBF file.
  dir.Write("ali.ark", "2 5 \n1 3 4 \n5 0 \n");
  for (bool frame_mode : {false, true}) {
    SCOPED_TRACE(frame_mode);
    auto config = Config(dir, absl::StrCat(R"(
datasets:
  d:
    randomize: false
    frameMode: )", frame_mode ? "true" : "false", R"(
    deserializers:
      - type: KaldiTable
        rspecifier: "ark,t:ali.ark"
        kind: int32-vector
        input: {labels: {format: ids}}
      - type: CNTKBinary
        file: )", cbf, R"(
)"));
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<std::string> messages;
    auto dump = DumpDataset(*config, ReadOptions(), &messages);
    ASSERT_TRUE(dump.ok()) << dump.status();
    if (!frame_mode) {
      EXPECT_EQ(*dump, Line("2", "\"labels\":{\"ids\":[[5]]},\"x\":{\"dense\":[[7,8]]}") +
                           Line("1", "\"labels\":{\"ids\":[[3],[4]]},\"x\":{\"dense\":[[3,4],[5,6]]}"));
    } else {
      // Frames in the primary's order; a multi-frame sequence's frames are "key/frame".
      EXPECT_EQ(*dump, Line("2", "\"labels\":{\"ids\":[[5]]},\"x\":{\"dense\":[[7,8]]}") +
                           Line("1/0", "\"labels\":{\"ids\":[[3]]},\"x\":{\"dense\":[[3,4]]}") +
                           Line("1/1", "\"labels\":{\"ids\":[[4]]},\"x\":{\"dense\":[[5,6]]}"));
    }
  }
}

// Many small chunks on both sides, the secondary in the reverse order, randomized: every
// sequence arrives once with its own label (the label encodes the id), whatever the order
// in which chunks are parsed and decoded.
TEST(Composite, RandomizedManyChunksKeepEverySequenceWhole) {
  TempDir dir;
  std::string feats, labels;
  const int n = 300;
  for (int i = 0; i < n; ++i) {
    const int rows = 1 + i % 3;
    for (int r = 0; r < rows; ++r) absl::StrAppend(&feats, i, " |x ", i, " ", r, "\n");
  }
  for (int i = n - 1; i >= 0; --i) {
    const int rows = 1 + i % 3;
    for (int r = 0; r < rows; ++r) absl::StrAppend(&labels, i, " |y ", i % 7, ":", i, "\n");
  }
  const std::string f = dir.Write("f.ctf", feats), l = dir.Write("l.ctf", labels);
  auto config = TwoFiles(dir, f, l, "    randomize: true\n    randomizationWindow: 3\n",
                         "        chunkSizeInBytes: 200\n", "        chunkSizeInBytes: 150\n", 7);
  ASSERT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = 16;
  ro.threads = 2;
  auto dump = DumpDataset(*config, ro);
  ASSERT_TRUE(dump.ok()) << dump.status();
  std::vector<std::string> got;
  for (absl::string_view line : absl::StrSplit(*dump, '\n', absl::SkipEmpty())) {
    const size_t k = line.find("\"key\":\"");
    const size_t e = line.find('"', k + 7);
    got.emplace_back(line.substr(k + 7, e - k - 7));
    const int i = std::stoi(got.back());
    std::string x = "[", y = "[";
    for (int r = 0; r < 1 + i % 3; ++r) {
      absl::StrAppend(&x, r ? "," : "", "[", i, ",", r, "]");
      absl::StrAppend(&y, r ? "," : "", "[[", i % 7, ",", i, "]]");
    }
    EXPECT_NE(line.find(absl::StrCat("\"x\":{\"dense\":", x, "]},\"y\":{\"sparse\":", y, "]}")), absl::string_view::npos)
        << line;
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  EXPECT_FALSE(std::is_sorted(got.begin(), got.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a) < std::stoi(b);
  }));  // randomized
  std::sort(got.begin(), got.end());
  EXPECT_EQ(std::unique(got.begin(), got.end()), got.end());
}

// A secondary CTF file in an order unrelated to the primary's: every sequence still arrives
// with its own label, and the open says that the order costs re-parsing, and what to do.
TEST(Composite, AScatteredSecondaryIsCorrectAndWarnedAbout) {
  TempDir dir;
  const int n = 200;
  std::string feats, labels;
  for (int i = 0; i < n; ++i) absl::StrAppend(&feats, i, " |x ", i, " 0\n");
  for (int j = 0; j < n; ++j) {
    const int i = (j * 77) % n;  // 77 is prime to 200: a permutation that jumps around
    absl::StrAppend(&labels, i, " |y ", i % 5, ":1\n");
  }
  const std::string f = dir.Write("f.ctf", feats), l = dir.Write("l.ctf", labels);
  auto config = TwoFiles(dir, f, l, "    randomize: false\n", "", "        chunkSizeInBytes: 100\n");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<std::string> messages;
  auto dump = DumpDataset(*config, ReadOptions(), &messages);
  ASSERT_TRUE(dump.ok()) << dump.status();
  bool warned = false;
  for (const std::string& m : messages) warned = warned || m.find("is joined in an order far from its own") != std::string::npos;
  EXPECT_TRUE(warned);
  std::string want;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&want, "{\"epoch\":0,\"batch\":0,\"key\":\"", i, "\",\"streams\":{\"x\":{\"dense\":[[", i,
                    ",0]]},\"y\":{\"sparse\":[[[", i % 5, ",1]]]}}}\n");
  }
  EXPECT_EQ(*dump, want);
}

// maxErrors counts what reading meets: a bad sequence in a CTF member is one error per epoch,
// not one more for the scan at open.
TEST(Composite, TheOpenScanSpendsNoErrorBudget) {
  TempDir dir;
  const std::string feats = dir.Write("f.ctf", "0 |x 1 2\n1 |x 3 4\n2 |x 5 6\n");
  const std::string labels = dir.Write("l.ctf", "0 |y 1:1\n1 |y 9:1\n2 |y 0:1\n");  // 9 >= dim 5
  for (int max_errors : {0, 1}) {
    SCOPED_TRACE(max_errors);
    auto config = TwoFiles(dir, feats, labels, absl::StrCat("    randomize: false\n    maxErrors: ", max_errors, "\n"));
    ASSERT_TRUE(config.ok()) << config.status();
    std::vector<std::string> messages;
    auto dump = DumpDataset(*config, ReadOptions(), &messages);
    if (max_errors == 0) {
      ASSERT_FALSE(dump.ok());
      EXPECT_NE(dump.status().message().find("l.ctf:2:"), std::string::npos) << dump.status();
      continue;
    }
    ASSERT_TRUE(dump.ok()) << dump.status();
    EXPECT_EQ(*dump, Line("0", "\"x\":{\"dense\":[[1,2]]},\"y\":{\"sparse\":[[[1,1]]]}") +
                         Line("2", "\"x\":{\"dense\":[[5,6]]},\"y\":{\"sparse\":[[[0,1]]]}"));
  }
}

TEST(Composite, AFileThatCannotOpenNamesItself) {
  TempDir dir;
  const std::string feats = dir.Write("feats.ctf", "0 |x 1 2\n");
  auto config = Config(dir, absl::StrCat(R"(
datasets:
  d:
    deserializers:
      - type: CNTKTextFormat
        file: )", feats, R"(
        input: {x: {dim: 2, format: dense}}
      - type: CNTKBinary
        file: )", feats, R"(
)"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(*config);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("feats.ctf: not a CNTK binary file"), std::string::npos) << ds.status();
}

}  // namespace
}  // namespace conveyor::testing
