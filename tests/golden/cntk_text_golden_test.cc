// CNTK's own CTF reader tests (tests/data/cntk/CNTKTextFormatReader): each configuration from
// CNTK's .cntk files, read by conveyor with the test's epoch size, minibatch size and epoch
// count, must print what CNTK's control file holds (tests/data/README.md: dense rows per non-gap
// column of CNTK's layout, at most 10 minibatches per epoch).
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/config/config_loader.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string CtfDir() { return TestdataDir() + "/cntk/CNTKTextFormatReader"; }

DatasetConfig CntkDataset(const std::string& config_file, const std::string& name) {
  const std::string path = CtfDir() + "/Config/" + config_file;
  auto config = ParseConfig(ReadFile(path), path, CtfDir() + "/Data/");
  EXPECT_TRUE(config.ok()) << config.status();
  const DatasetConfig* d = config.ok() ? config->Find(name) : nullptr;
  EXPECT_NE(d, nullptr) << name;
  // Randomized CNTK tests read files whose sequences are all identical: the output does not
  // depend on the order, so they run randomized, as configured.
  return d ? *d : DatasetConfig();
}

struct Case {
  const char* config;
  const char* dataset;
  const char* control;
  uint64_t epoch_size, mb_size, epochs;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.control; }

class CntkControl : public ::testing::TestWithParam<Case> {};

TEST_P(CntkControl, MatchesControlFile) {
  const Case& c = GetParam();
  DatasetConfig ds = CntkDataset(c.config, c.dataset);
  ReadOptions ro;
  ro.epoch_size = c.epoch_size;
  ro.minibatch_size = c.mb_size;
  ro.epochs = c.epochs;
  ro.max_batches_per_epoch = 10;
  auto ours = CntkControlTokens(ds, ro);
  ASSERT_TRUE(ours.ok()) << ours.status();
  const std::vector<std::string> expected = Tokens(ReadFile(CtfDir() + "/Control/" + c.control));
  ASSERT_EQ(ours->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = std::strtod((*ours)[i].c_str(), nullptr), e = std::strtod(expected[i].c_str(), nullptr);
    ASSERT_LE(std::fabs(a - e), 1e-5 * std::max(1.0, std::fabs(e)))
        << "token " << i << ": conveyor " << (*ours)[i] << ", CNTK " << expected[i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dense, CntkControl,
    ::testing::Values(Case{"dense.cntk", "Simple", "Simple_dense.txt", 1000, 250, 10},
                      Case{"dense.cntk", "MNIST", "MNIST_dense.txt", 1000, 1000, 1},
                      Case{"dense.cntk", "10x10", "10x10_dense.txt", 100, 100, 1},
                      Case{"dense.cntk", "50x20_jagged_sequences", "50x20_jagged_sequences_dense.txt", 508, 508, 1},
                      Case{"dense.cntk", "100x1", "100x1_1_dense.txt", 10, 1, 10},
                      Case{"dense.cntk", "100x1", "100x1_2_dense.txt", 5, 3, 4},
                      Case{"dense.cntk", "10x1_MI", "10x1_MI_1_dense.txt", 10, 1, 3},
                      Case{"dense.cntk", "10x1_MI", "10x1_MI_2_dense.txt", 7, 3, 3},
                      Case{"dense.cntk", "1x1", "1x1_1_dense.txt", 1, 1, 1},
                      Case{"dense.cntk", "1x1", "1x1_2_dense.txt", 2, 1, 3},
                      Case{"dense.cntk", "1x2", "1x2_dense.txt", 0, 1, 1},
                      Case{"dense.cntk", "1x10", "1x10_dense.txt", 0, 1, 1},
                      // traceLevel 0, and the file's L stream is not configured: skipped.
                      Case{"dense.cntk", "Simple_single_stream", "Simple_dense_single_stream.txt", 0, 1000, 1}));

INSTANTIATE_TEST_SUITE_P(
    Sparse, CntkControl,
    ::testing::Values(Case{"sparse.cntk", "1x1", "1x1_sparse.txt", 0, 1, 1},
                      Case{"sparse.cntk", "1x2", "1x2_sparse.txt", 0, 1, 1},
                      Case{"sparse.cntk", "1x10", "1x10_sparse.txt", 0, 1, 1},
                      Case{"sparse.cntk", "10x10", "10x10_sparse.txt", 0, 100, 1},
                      Case{"sparse.cntk", "3x5_MI", "3x5_MI_sparse.txt", 0, 20, 1},
                      Case{"sparse.cntk", "20x10_MI_jagged_samples", "20x10_MI_jagged_samples_sparse.txt", 0, 200, 1},
                      Case{"sparse.cntk", "50x20_jagged_sequences", "50x20_jagged_sequences_sparse.txt", 0, 1000, 1}));

INSTANTIATE_TEST_SUITE_P(
    EdgeCases, CntkControl,
    ::testing::Values(Case{"edge_cases.cntk", "space_separated", "space_separated.txt", 0, 1, 1},
                      // empty dense -> zeros, short dense -> zero-padded, empty sparse -> nnz 0
                      Case{"edge_cases.cntk", "empty_samples", "empty_samples.txt", 0, 10, 1},
                      Case{"edge_cases.cntk", "ref_data_with_escape_sequences", "ref_data_with_escape_sequences.txt", 0, 10, 1},
                      Case{"edge_cases.cntk", "missing_trailing_newline", "missing_trailing_newline.txt", 0, 1, 1}));

// blank_lines (a): skipSequenceIds, maxErrors 0: the blank row stops reading.
TEST(CntkEdgeCases, BlankLineIsAnErrorWithoutBudget) {
  DatasetConfig ds = CntkDataset("edge_cases.cntk", "blank_lines");
  auto out = DumpDataset(ds, ReadOptions());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("contains_blank_lines.txt:2:1: empty row"), std::string::npos)
      << out.status();
}

// blank_lines_ignored (c): ids, maxErrors 2: the blank row is counted and skipped; CNTK
// prints `1 2`. (CNTK also counts a second error for the row it expected there.)
TEST(CntkEdgeCases, BlankLineSkippedWithinBudget) {
  DatasetConfig ds = CntkDataset("edge_cases.cntk", "blank_lines_ignored");
  ReadOptions ro;
  ro.minibatch_size = 1;
  auto tokens = CntkControlTokens(ds, ro);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, Tokens(ReadFile(CtfDir() + "/Control/blank_lines.txt")));
}

// duplicate_inputs: `1 |F1 1.0 |F2 2.0 |F2 3.0` with maxErrors 0 is refused.
TEST(CntkEdgeCases, DuplicateInputOnOneRowIsRefused) {
  DatasetConfig ds = CntkDataset("edge_cases.cntk", "duplicate_inputs");
  auto out = DumpDataset(ds, ReadOptions());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("duplicate_inputs.txt:1:19: input 'F2' appears twice"), std::string::npos)
      << out.status();
}

// invalid_inputs (CNTK's TextParser test, maxErrors 99999): loading does not fail, and every
// sequence but id 5 ("the only well-formed sequence in this file") is dropped as bad.
TEST(CntkEdgeCases, InvalidInputsKeepsOnlyTheWellFormedSequence) {
  DatasetConfig ds = CtfDataset(CtfDir() + "/Data/invalid_inputs.txt",
                                "{A: {dim: 1, format: dense}, B: {dim: 10, format: sparse}}",
                                "maxErrors: 99999");
  std::vector<std::string> messages;
  auto out = DumpDataset(ds, ReadOptions(), &messages);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "{\"epoch\":0,\"batch\":0,\"key\":\"5\",\"streams\":{\"A\":{\"dense\":[[5]]},"
                  "\"B\":{\"sparse\":[[[5,5]]]}}}\n");
  auto has = [&](const std::string& needle) {
    for (const auto& m : messages)
      if (m.find(needle) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("invalid_inputs.txt:2:13: sparse index 10 of input 'B' is out of range"));
  EXPECT_TRUE(has("invalid_inputs.txt:5:7: unexpected ',' in a number for input 'A'"));
  EXPECT_TRUE(has("invalid_inputs.txt:19:4: '|' is followed by ' ': expected an input name"));
  EXPECT_TRUE(has("invalid_inputs.txt:35:1: sequence 123 has 3 rows but its longest input has 2 samples"));
  EXPECT_TRUE(has("invalid_inputs.txt:40:8: input 'A' has more than dim=1 values"));
  EXPECT_TRUE(has("invalid_inputs.txt:39:76: input 'A' has 0 of dim=1 values; zero-padded"));
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

std::string PyDir() { return TestdataDir() + "/cntk/python_io_tests"; }

// CNTK's Python io_tests (python_io_tests/EXPECTED.md), the cases whose settings match.
TEST(CntkPythonIo, TextFormatSparseAndDenseInOneMinibatch) {
  // test_text_format: next_minibatch(7) -> 2 sequences, features (2,4,1000) with 7 samples,
  // labels (2,1,5) with values [1,0,0,0,0] and [0,1,0,0,0].
  DatasetConfig ds = CtfDataset(PyDir() + "/MBDATA_SPARSE.ctf",
                                "{features: {alias: x, dim: 1000, format: sparse}, labels: {alias: y, dim: 5, format: dense}}");
  ReadOptions ro;
  ro.minibatch_size = 7;
  auto out = DumpDataset(ds, ro);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"features\":{\"sparse\":[[[560,1]],[[0,1]],[[0,1]]]},"
            "\"labels\":{\"dense\":[[1,0,0,0,0]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"features\":{\"sparse\":[[[560,1]],[[0,1]],[[0,1]],[[424,1]]]},"
            "\"labels\":{\"dense\":[[0,1,0,0,0]]}}}\n");
}

TEST(CntkPythonIo, FullSweepMinibatchKeepsEachStreamsLength) {
  // test_full_sweep_minibatch: features [[0],[1],[2],[3]] and [[4],[5],[6]];
  // labels [[0],[1],[3]] and [[1],[2]].
  DatasetConfig ds = CtfDataset(PyDir() + "/MBDATA_DENSE_1.ctf",
                                "{features: {alias: S0, dim: 1, format: dense}, labels: {alias: S1, dim: 1, format: dense}}");
  ReadOptions ro;
  ro.minibatch_size = 1000;
  auto out = DumpDataset(ds, ro);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"features\":{\"dense\":[[0],[1],[2],[3]]},\"labels\":{\"dense\":[[0],[1],[3]]}}}\n"
            "{\"epoch\":0,\"batch\":0,\"key\":\"1\",\"streams\":{\"features\":{\"dense\":[[4],[5],[6]]},\"labels\":{\"dense\":[[1],[2]]}}}\n");
}

TEST(CntkPythonIo, MinibatchDefinedByLabels) {
  // test_minibatch_defined_by_labels: labels define the size; mb(2) -> 2 sequences with 7
  // feature samples and 2 label samples.
  DatasetConfig ds = CtfDataset(PyDir() + "/MBDATA_SPARSE.ctf",
                                "{features: {alias: x, dim: 1000, format: sparse}, labels: {alias: y, dim: 5, format: dense, definesMBSize: true}}");
  ReadOptions ro;
  ro.minibatch_size = 2;
  auto out = DumpDataset(ds, ro);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("\"batch\":0,\"key\":\"1\""), std::string::npos) << *out;
}

}  // namespace
}  // namespace conveyor::testing
