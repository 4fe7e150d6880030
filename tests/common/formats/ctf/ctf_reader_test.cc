// The CTF reader against CNTK's page "BrainScript CNTK Text Format Reader": every
// example decoded exactly, every invalid example refused at the right line, and each rule.
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/batch/dump_writer.h"
#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/huge_pages.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

class CtfReader : public ::testing::Test {
 protected:
  // Reads `data` with the `input:` YAML, whole file as one minibatch per sequence batch.
  absl::StatusOr<std::string> Read(const std::string& data, const std::string& input,
                                   const std::string& extra = "", uint64_t mb = 1000000) {
    DatasetConfig ds = CtfDataset(dir_.Write("data.ctf", data), input, extra);
    ReadOptions ro;
    ro.minibatch_size = mb;
    messages_.clear();
    return DumpDataset(ds, ro, &messages_);
  }
  bool Logged(const std::string& needle) const {
    for (const auto& m : messages_)
      if (m.find(needle) != std::string::npos) return true;
    return false;
  }
  TempDir dir_;
  std::vector<std::string> messages_;
};

constexpr char kSimpleInput[] =
    "{A: {dim: 5, format: dense}, B: {dim: 1000000, format: sparse}, C: {dim: 1, format: dense}}";

TEST_F(CtfReader, DecodesSeedSimpleExample) {
  auto out = Read(
      "|B 100:3 123:4 |C 8 |A 0 1 2 3 4 |# a CTF comment\n"
      "|# another comment |A 0 1.1 22 0.3 54 |C 123917 |B 1134:1.911 13331:0.014\n"
      "|C -0.001 |# a comment with an escaped pipe: '|#' |A 3.9 1.11 121.2 99.13 0.04 |B 999:0.001 918918:-9.19\n",
      kSimpleInput);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"A\":{\"dense\":[[0,1,2,3,4]]},\"B\":{\"sparse\":[[[100,3],[123,4]]]},\"C\":{\"dense\":[[8]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"A\":{\"dense\":[[0,1.10000002,22,0.300000012,54]]},\"B\":{\"sparse\":[[[1134,1.91100001],[13331,0.0140000004]]]},\"C\":{\"dense\":[[123917]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"2\",\"streams\":{\"A\":{\"dense\":[[3.9000001,1.11000001,121.199997,99.1299973,0.0399999991]]},\"B\":{\"sparse\":[[[999,0.00100000005],[918918,-9.18999958]]]},\"C\":{\"dense\":[[-0.00100000005]]}}}\n");
}

// An input whose name or alias matches nothing in the file leaves every sequence without it,
// which the format allows line by line: a warning at open names it and what the file has.
TEST_F(CtfReader, AnInputTheFileNeverNamesIsAWarningAtOpen) {
  auto out = Read("|f 1 2 |lab 1 0\n|f 3 4 |lab 0 1 |# a comment |x\n",
                  "{features: {alias: feat, dim: 2, format: dense}, lab: {dim: 2, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(Logged("input 'features' (alias 'feat') never occurs in " + dir_.path() + "/data.ctf (the inputs "
                     "there: f, lab, x); its sequences will have no samples of it unless its name or alias is fixed"))
      << ::testing::PrintToString(messages_);
  EXPECT_FALSE(Logged("input 'lab'"));
  // Named by the file: no warning.
  auto fine = Read("|f 1 2 |lab 1 0\n", "{features: {alias: f, dim: 2, format: dense}, lab: {dim: 2, format: dense}}");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_FALSE(Logged("never occurs")) << ::testing::PrintToString(messages_);
}

constexpr char kExtendedData[] =
    "100 |a 1 2 3 |b 100 200\n"
    "100 |a 4 5 6 |b 101 201\n"
    "100 |b 102983 14532 |a 7 8 9\n"
    "100 |a 7 8 9\n"
    "200 |b 300 400 |a 10 20 30\n"
    "333 |b 500 100\n"
    "333 |b 600 -900\n"
    "400 |a 1 2 3 |b 100 200\n"
    "|a 4 5 6 |b 101 201\n"
    "|a 4 5 6 |b 101 201\n"
    "500 |a 1 2 3 |b 100 200\n"
    "\n";
constexpr char kExtendedInput[] =
    "{Some_very_long_input_name: {alias: a, dim: 3, format: dense}, "
    "Some_other_also_very_long_input_name: {alias: b, dim: 2, format: dense}}";

TEST_F(CtfReader, DecodesSeedExtendedExampleIntoFiveSequences) {
  auto out = Read(kExtendedData, kExtendedInput, "precision: double");
  ASSERT_TRUE(out.ok()) << out.status();
  const std::string a = "\"Some_very_long_input_name\":", b = "\"Some_other_also_very_long_input_name\":";
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"100\",\"streams\":{" + a + "{\"dense\":[[1,2,3],[4,5,6],[7,8,9],[7,8,9]]}," + b + "{\"dense\":[[100,200],[101,201],[102983,14532]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"200\",\"streams\":{" + a + "{\"dense\":[[10,20,30]]}," + b + "{\"dense\":[[300,400]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"333\",\"streams\":{" + a + "{\"dense\":[]}," + b + "{\"dense\":[[500,100],[600,-900]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"400\",\"streams\":{" + a + "{\"dense\":[[1,2,3],[4,5,6],[4,5,6]]}," + b + "{\"dense\":[[100,200],[101,201],[101,201]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"500\",\"streams\":{" + a + "{\"dense\":[[1,2,3]]}," + b + "{\"dense\":[[100,200]]}}}\n");
}

TEST_F(CtfReader, FirstLineWithoutIdIgnoresAllIds) {
  auto out = Read("|a 1 2 3 |b 100 200\n100 |a 4 5 6 |b 101 201\n200 |b 102983 14532 |a 7 8 9\n\n",
                  "{a: {dim: 3, format: dense}, b: {dim: 2, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[1,2,3]]},\"b\":{\"dense\":[[100,200]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[4,5,6]]},\"b\":{\"dense\":[[101,201]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"2\",\"streams\":{\"a\":{\"dense\":[[7,8,9]]},\"b\":{\"dense\":[[102983,14532]]}}}\n");
}

TEST_F(CtfReader, SkipSequenceIdsMakesEveryLineASequence) {
  DatasetConfig ds = CtfDataset(dir_.Write("d.ctf", "7 |a 1\n7 |a 2\n"), "{a: {dim: 1, format: dense}}");
  ds.deserializers[0].skip_sequence_ids = true;
  auto out = DumpDataset(ds, ReadOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[1]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[2]]}}}\n");
}

TEST_F(CtfReader, RejectsIdRepeatedOnNonConsecutiveLines) {
  auto out = Read("100 |a 1 2 3 |b 100 200\n200 |a 4 5 6 |b 101 201\n100 |b 102983 14532 |a 7 8 9\n",
                  "{a: {dim: 3, format: dense}, b: {dim: 2, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("data.ctf:3:1: sequence id 100 was already used at line 1"),
            std::string::npos) << out.status();
}

TEST_F(CtfReader, RejectsSequenceWithMoreRowsThanSamples) {
  auto out = Read("123 |a 1 2 3 |b 100 200\n456 |a 4 5 6\n456 |b 101 201\n",
                  "{a: {dim: 3, format: dense}, b: {dim: 2, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("data.ctf:2:1: sequence 456 has 2 rows but its longest input has 1 samples"),
            std::string::npos) << out.status();
}

TEST_F(CtfReader, RejectsDenseSampleWithMoreValuesThanDim) {
  auto out = Read("|a 1 2 3 4\n", "{a: {dim: 3, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("data.ctf:1:10: input 'a' has more than dim=3 values"), std::string::npos)
      << out.status();
}

TEST_F(CtfReader, RejectsSparseIndexAtOrBeyondDim) {
  auto out = Read("|s 3:1 10:2\n", "{s: {dim: 10, format: sparse}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("data.ctf:1:8: sparse index 10 of input 's' is out of range: expected an index below dim=10"),
            std::string::npos) << out.status();
}

TEST_F(CtfReader, RejectsNegativeSparseIndex) {
  auto out = Read("|s -2:1\n", "{s: {dim: 10, format: sparse}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("data.ctf:1:4: unexpected '-': expected a sparse index"), std::string::npos)
      << out.status();
}

TEST_F(CtfReader, RejectsSameInputTwiceOnALine) {
  auto out = Read("|a 1 |a 2\n", "{a: {dim: 1, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("data.ctf:1:6: input 'a' appears twice on one row"), std::string::npos)
      << out.status();
}

TEST_F(CtfReader, AcceptsCntkNumberSyntax) {
  // CNTK's no_trailing_newline_valid_input cases: 1, -123, 45., 6.78, 9.10e-11.
  const char* cases[][2] = {{"1", "1"}, {"-123", "-123"}, {"45.", "45"}, {"6.78", "6.78000021"},
                            {"9.10e-11", "9.09999992e-11"}, {"+2", "2"}, {"1E3", "1000"}};
  for (auto& c : cases) {
    auto out = Read(std::string("|A ") + c[0], "{A: {dim: 1, format: dense}}");
    ASSERT_TRUE(out.ok()) << c[0] << ": " << out.status();
    EXPECT_EQ(*out, std::string("{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"A\":{\"dense\":[[") + c[1] + "]]}}}\n") << c[0];
  }
}

TEST_F(CtfReader, RejectsBadNumbers) {
  // CNTK's no_trailing_newline_invalid_input cases, and the documentation page's.
  for (const char* bad : {" -", " +", " 12.+", " 12.+e", " 1:", " .5", " 2,0", " 2#0", " 2.0f", " nan", " inf", " 1e400", " --1"}) {
    auto out = Read(std::string("|A") + bad, "{A: {dim: 1, format: dense}}");
    ASSERT_FALSE(out.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(out.status().message().find("data.ctf:1:"), std::string::npos) << out.status();
  }
}

TEST_F(CtfReader, EmptyRowsAreErrors) {
  for (const char* data : {"", "\t", " ", "     "}) {
    auto out = Read(std::string("|A 1\n|A") + data + "\n|A 2\n", "{A: {dim: 1, format: sparse}}");
    (void)out;
  }
  auto out = Read("|A 1\n|# only a comment\n", "{A: {dim: 1, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("data.ctf:2:1: empty row"), std::string::npos) << out.status();
}

TEST_F(CtfReader, ZeroPadsShortDenseSampleWithAWarning) {
  auto out = Read("|a 1 2\n|a\n", "{a: {dim: 3, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[1,2,0]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[0,0,0]]}}}\n");
  EXPECT_TRUE(Logged("data.ctf:1:3: input 'a' has 2 of dim=3 values; zero-padded"));
}

// The chunk's values are sized without zeroing (HugePageAllocator): the padding is written.
// Blocks that held other values are kept for reuse first, so the values land in dirty memory
// wherever blocks are in use (not under AddressSanitizer).
TEST_F(CtfReader, ZeroPadsShortDenseSamplesInReusedMemory) {
  for (size_t mib = 2; mib <= 16; mib += 2) {
    HugeVector<float> dirty(mib * (size_t{1} << 20) / sizeof(float), 7.25f);
  }
  const uint64_t reuses = GetHugeBlockStats().reuses;
  std::string data;
  for (int i = 0; i < 20000; ++i) data += i % 2 ? "|a 1 2\n" : "|a 3\n";  // 20000 x 16 floats: 1.3 MB
  auto out = Read(data, "{a: {dim: 16, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  if (HugeBlocksInUse()) {  // (else: operator new's memory)
    EXPECT_GT(GetHugeBlockStats().reuses, reuses);
  }
  EXPECT_EQ(out->find("7.25"), std::string::npos);
  size_t ones = 0, threes = 0;
  for (size_t at = 0; (at = out->find("[[1,2,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]", at)) != std::string::npos; ++at) ++ones;
  for (size_t at = 0; (at = out->find("[[3,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]", at)) != std::string::npos; ++at) ++threes;
  EXPECT_EQ(ones, 10000u);
  EXPECT_EQ(threes, 10000u);
}

TEST_F(CtfReader, SkipsInputsTheConfigDoesNotName) {
  auto out = Read("|extra 1 2 3 |a 1 |another_very_long_name 4:5\n", "{a: {dim: 1, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[1]]}}}\n");
}

TEST_F(CtfReader, KeepsSparseEntriesInFileOrder) {
  auto out = Read("|s 9:1 2:2 9:3\n|s\n", "{s: {dim: 10, format: sparse}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"s\":{\"sparse\":[[[9,1],[2,2],[9,3]]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"s\":{\"sparse\":[[]]}}}\n");
}

TEST_F(CtfReader, TabsSpacesCrlfBomAndMissingFinalNewline) {
  auto out = Read("\xEF\xBB\xBF" "1\t|a\t1  2\r\n1 |a 3\t4 |# c\r\n2|a 5 6",
                  "{a: {dim: 2, format: dense}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[1,2],[3,4]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"2\",\"streams\":{\"a\":{\"dense\":[[5,6]]}}}\n");
}

TEST_F(CtfReader, CommentsEndAtTheNextUnescapedPipe) {
  auto out = Read("|# c1 |# still the comment |a 1 |#x|#y|b 2:5\n",
                  "{a: {dim: 1, format: dense}, b: {dim: 3, format: sparse}}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[1]]},\"b\":{\"sparse\":[[[2,5]]]}}}\n");
}

TEST_F(CtfReader, RefusesUtf16) {
  auto out = Read(std::string("\xFF\xFE|\0a\0", 6), "{a: {dim: 1, format: dense}}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("UTF-16"), std::string::npos) << out.status();
}

TEST_F(CtfReader, MaxErrorsSkipsBadSequencesUntilTheBudgetIsSpent) {
  const std::string data = "1 |a 1\n2 |a x\n3 |a 3\n4 |a y\n5 |a 5\n";
  auto within = Read(data, "{a: {dim: 1, format: dense}}", "maxErrors: 2");
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(*within,
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[1]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"3\",\"streams\":{\"a\":{\"dense\":[[3]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"5\",\"streams\":{\"a\":{\"dense\":[[5]]}}}\n");
  EXPECT_TRUE(Logged("data.ctf:2:6: unexpected 'x': expected a number for input 'a'; sequence 2 skipped"));
  auto beyond = Read(data, "{a: {dim: 1, format: dense}}", "maxErrors: 1");
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("data.ctf:4:6: unexpected 'y'"), std::string::npos) << beyond.status();
  EXPECT_NE(beyond.status().message().find("more than maxErrors=1"), std::string::npos) << beyond.status();
}

// A chunk that kept every sequence says so (identity_slots: the loader then takes a piece's
// slot from its place in the chunk instead of reading slot_of); one that dropped a bad
// sequence does not, and its slots skip the dropped ones.
TEST_F(CtfReader, AChunkSaysWhetherItKeptEverySequence) {
  for (const bool bad : {false, true}) {
    const std::string data = bad ? "1 |a 1\n2 |a x\n3 |a 3\n" : "1 |a 1\n2 |a 2\n3 |a 3\n";
    auto ds = Dataset::Open(CtfDataset(dir_.Write(bad ? "bad.ctf" : "good.ctf", data), "{a: {dim: 1, format: dense}}",
                                       "maxErrors: 1"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    auto chunk = (*ds)->ParseChunk(0);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_EQ((*chunk)->identity_slots, !bad);
    EXPECT_EQ((*chunk)->slot_of, bad ? HugeVector<int32_t>({0, -1, 1}) : HugeVector<int32_t>({0, 1, 2}));
  }
}

// maxErrors counts bad sequences of the input, not how often they are read: a chunk parsed
// again (each epoch here: a chunk no reader holds is dropped) meets the same two bad
// sequences, which were counted the first time. Before, epoch 2 spent the budget again and
// failed with "more than maxErrors=2".
TEST_F(CtfReader, MaxErrorsCountsABadSequenceOnceHoweverOftenItIsRead) {
  const std::string data = "1 |a 1\n2 |a x\n3 |a 3\n4 |a y\n5 |a 5\n";
  // A chunk a line (chunkSizeInBytes: 1), so that no chunk stays held from one epoch to the next.
  auto config = [&](const std::string& name, const std::string& text) {
    auto c = ParseConfig(absl::StrCat("datasets:\n  d:\n    randomize: false\n    maxErrors: 2\n    deserializers:\n"
                                      "      - type: CNTKTextFormat\n        file: ",
                                      dir_.Write(name, text),
                                      "\n        chunkSizeInBytes: 1\n        input: {a: {dim: 1, format: dense}}\n"),
                         "test.yaml", "");
    EXPECT_TRUE(c.ok()) << c.status();
    return c->datasets[0];
  };
  DatasetConfig ds = config("data.ctf", data);
  ReadOptions ro;
  ro.epochs = 5;
  auto out = DumpDataset(ds, ro, &messages_);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::string epoch0 =
      "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"a\":{\"dense\":[[1]]}}}\n"
      "{\"epoch\":0,\"batch\":0,\"key\":\"3\",\"streams\":{\"a\":{\"dense\":[[3]]}}}\n"
      "{\"epoch\":0,\"batch\":0,\"key\":\"5\",\"streams\":{\"a\":{\"dense\":[[5]]}}}\n";
  EXPECT_EQ(out->substr(0, epoch0.size()), epoch0);
  EXPECT_NE(out->find("{\"epoch\":4,\"batch\":0,\"key\":\"5\""), std::string::npos) << *out;
  // One more bad sequence than the budget still fails, in the first epoch, as before.
  ds = config("data3.ctf", data + "6 |a z\n");
  auto beyond = DumpDataset(ds, ro, &messages_);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("data3.ctf:6:6: unexpected 'z'"), std::string::npos) << beyond.status();
}

TEST_F(CtfReader, TraceLevelZeroHidesWarnings) {
  auto out = Read("|a 1\n", "{a: {dim: 2, format: dense}}", "traceLevel: 0");
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(messages_.empty());
}

TEST_F(CtfReader, DefinesMBSizeCountsThatStream) {
  auto out = Read("0 |w 1 |c 1:1\n0 |w 2\n0 |w 3\n1 |w 4 |c 0:1\n",
                  "{w: {dim: 1, format: dense}, c: {dim: 2, format: sparse, definesMBSize: true}}",
                  "", /*mb=*/1);
  ASSERT_TRUE(out.ok()) << out.status();
  // Each sequence has one `c` sample, so a minibatch of 1 sample holds one sequence.
  EXPECT_NE(out->find("\"batch\":0,\"key\":\"0\""), std::string::npos);
  EXPECT_NE(out->find("\"batch\":1,\"key\":\"1\""), std::string::npos);
}

TEST_F(CtfReader, DoublePrecisionKeepsSeventeenDigits) {
  auto out = Read("|a 0.1\n", "{a: {dim: 1, format: dense}}", "precision: double");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"a\":{\"dense\":[[0.10000000000000001]]}}}\n");
}

// Chunks are read into memory of their own, one at a time (chunked_file.h): an error deep in
// a later chunk still names its line and column in the file, and the last sequence, without
// its newline, is parsed to the file's end.
TEST_F(CtfReader, ErrorsInLaterChunksNameTheirLineAndColumn) {
  std::string data;
  for (int i = 0; i < 300; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + ".25\n";
  data += "300 |a 7";  // no final newline
  DatasetConfig ds = CtfDataset(dir_.Write("data.ctf", data), "{a: {dim: 1, format: dense}}");
  ds.deserializers[0].chunk_size_in_bytes = 500;
  ReadOptions ro;
  ro.minibatch_size = 1000;
  auto good = DumpDataset(ds, ro);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE(good->find("\"key\":\"299\",\"streams\":{\"a\":{\"dense\":[[299.25]]}}"), std::string::npos);
  EXPECT_NE(good->find("\"key\":\"300\",\"streams\":{\"a\":{\"dense\":[[7]]}}"), std::string::npos);
  const size_t at = data.find("\n250 |a ") + 1;
  data[at + 7] = 'q';  // line 251, column 8: "250 |a 250.25" -> "250 |a q50.25"
  ds = CtfDataset(dir_.Write("data.ctf", data), "{a: {dim: 1, format: dense}}");
  ds.deserializers[0].chunk_size_in_bytes = 500;
  auto bad = DumpDataset(ds, ro);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("data.ctf:251:8: unexpected 'q': expected a number for input 'a'"),
            std::string::npos)
      << bad.status();
}

// A file cut short after it was opened (its index no longer matches): the chunks past the cut
// are an error naming the file and what happened, not a SIGBUS from a mapping past its end.
TEST_F(CtfReader, AFileCutShortAfterOpeningIsAnErrorNotACrash) {
  std::string data;
  for (int i = 0; i < 300; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  DatasetConfig config = CtfDataset(dir_.Write("cut.ctf", data), "{a: {dim: 1, format: dense}}");
  config.deserializers[0].chunk_size_in_bytes = 500;
  ChunkEntry last;
  const absl::Status cut = ParseTheLastChunkOfAFileCutShort(config, 2, &last);
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss) << cut;
  EXPECT_NE(cut.message().find("cut.ctf: the file ends at byte " + std::to_string(last.begin_offset + 2) +
                               ", before byte " + std::to_string(last.end_offset)),
            std::string::npos)
      << cut;
}

// Rewritten in place with its size kept while open (a generator run again over the path):
// the next chunk read is refused as DataLoss naming the file, never parsed with the old
// file's sequence offsets (which would cut the new lines at the wrong places).
TEST_F(CtfReader, AFileRewrittenInPlaceWhileOpenIsAnError) {
  std::string before, after;
  for (int i = 0; i < 300; ++i) before += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  while (after.size() < before.size()) after += "7 |a 1234567\n";
  after.resize(before.size() - 1);
  after += "\n";
  const std::string path = dir_.Write("same.ctf", before);
  DatasetConfig config = CtfDataset(path, "{a: {dim: 1, format: dense}}");
  config.deserializers[0].chunk_size_in_bytes = 500;
  auto ds = Dataset::Open(config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_TRUE((*ds)->ParseChunk(0).ok());
  ASSERT_EQ(RewriteInPlace(path, after), absl::OkStatus());
  for (uint64_t c : {uint64_t{0}, uint64_t{1}}) {
    auto chunk = (*ds)->ParseChunk(c);
    ASSERT_FALSE(chunk.ok()) << "chunk " << c;
    EXPECT_EQ(chunk.status().code(), absl::StatusCode::kDataLoss) << chunk.status();
    EXPECT_NE(chunk.status().message().find("same.ctf: the file was changed after it was opened"), std::string::npos)
        << chunk.status();
  }
}

TEST_F(CtfReader, SameOutputForAnyThreadCountAndMinibatchSize) {
  std::string data;
  for (int i = 0; i < 3000; ++i) data += std::to_string(i / 3) + " |a " + std::to_string(i) + " |s " + std::to_string(i % 7) + ":1.5\n";
  DatasetConfig ds = CtfDataset(dir_.Write("big.ctf", data),
                                "{a: {dim: 1, format: dense}, s: {dim: 7, format: sparse}}");
  ds.deserializers[0].chunk_size_in_bytes = 1000;
  ReadOptions one;
  one.minibatch_size = 1;
  auto base = DumpDataset(ds, one);
  ASSERT_TRUE(base.ok()) << base.status();
  for (int threads : {2, 4}) {
    ReadOptions ro = one;
    ro.threads = threads;
    auto out = DumpDataset(ds, ro);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, *base) << threads << " threads";
  }
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// The parser's inlined decimal fast path must round exactly as strtof/strtod do.
TEST(CtfNumbers, FastPathIsCorrectlyRounded) {
  std::mt19937_64 rng(42);
  std::string data;
  std::vector<std::string> texts;
  for (int i = 0; i < 20000; ++i) {
    const int int_digits = static_cast<int>(rng() % 8), frac_digits = static_cast<int>(rng() % 12);
    std::string t = (rng() % 2) ? "-" : "";
    t += std::to_string(rng() % 10);
    for (int d = 0; d < int_digits; ++d) t += static_cast<char>('0' + rng() % 10);
    if (frac_digits > 0) {
      t += '.';
      for (int d = 0; d < frac_digits; ++d) t += static_cast<char>('0' + rng() % 10);
    }
    texts.push_back(t);
    data += "|a " + t + "\n";
  }
  TempDir dir;
  const std::string file = dir.Write("n.ctf", data);
  for (const char* precision : {"float", "double"}) {
    DatasetConfig ds = CtfDataset(file, "{a: {dim: 1, format: dense}}", std::string("precision: ") + precision);
    auto out = DumpDataset(ds, ReadOptions());
    ASSERT_TRUE(out.ok()) << out.status();
    std::istringstream lines(*out);
    std::string line;
    for (size_t i = 0; std::getline(lines, line); ++i) {
      std::string expected;
      if (std::string(precision) == "float") AppendNumber(std::strtof(texts[i].c_str(), nullptr), &expected);
      else AppendNumber(std::strtod(texts[i].c_str(), nullptr), &expected);
      ASSERT_NE(line.find("[[" + expected + "]]"), std::string::npos) << texts[i] << " -> " << line;
    }
  }
}

}  // namespace
}  // namespace conveyor::testing
