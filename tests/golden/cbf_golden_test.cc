// CNTK Binary Format against files written by CNTK's ctf2bin (tests/data/cntk/CNTKBinaryReader,
// byte-identical to CNTK's own test data): each decodes to exactly what the CTF reader gives
// for the text it was converted from (CBF keeps no order among a sample's sparse entries and
// keys sequences by index: compared without keys, entries sorted). And every truncation and
// every corrupted byte of a real file is an error naming the file, never a crash. As a
// member of a composite, a file of either layout is listed from the counts it states, with
// no chunk parsed, exactly as parsing gives it (CbfMember).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"
#include "common/config/config_loader.h"
#include "common/convert/cbf_writer.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/formats/chunked_file.h"
#include "common/formats/registry.h"
#include "common/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string BinDir() { return TestdataDir() + "/cntk/CNTKBinaryReader/Data/"; }
std::string TextDir() { return TestdataDir() + "/cntk/CNTKTextFormatReader/Data/"; }

DatasetConfig CbfDataset(const std::string& file, Precision precision, const std::string& input = "") {
  TempDir dir;
  std::string yaml = "datasets:\n  d:\n    randomize: false\n    precision: " +
                     std::string(precision == Precision::kFloat ? "float" : "double") +
                     "\n    deserializers:\n      - type: CNTKBinary\n        file: " + file + "\n";
  if (!input.empty()) yaml += "        input: " + input + "\n";
  auto config = LoadConfigFile(dir.Write("c.yaml", yaml));
  EXPECT_TRUE(config.ok()) << config.status();
  return config->datasets[0];
}

// Two parses of one chunk hold the same sequences, samples and values (wherever they lie).
void ExpectSameChunk(const ParsedChunk& a, const ParsedChunk& b, const std::string& where) {
  ASSERT_EQ(a.slot_of, b.slot_of) << where;
  ASSERT_EQ(a.keys, b.keys) << where;
  ASSERT_EQ(a.lengths, b.lengths) << where;
  ASSERT_EQ(a.streams.size(), b.streams.size()) << where;
  const size_t elem = a.precision == Precision::kFloat ? 4 : 8;
  for (size_t s = 0; s < a.streams.size(); ++s) {
    const ParsedStream &x = a.streams[s], &y = b.streams[s];
    ASSERT_EQ(x.format, y.format) << where;
    ASSERT_EQ(x.sequence_begin, y.sequence_begin) << where << ", stream " << s;
    ASSERT_EQ(x.nnz_begin, y.nnz_begin) << where << ", stream " << s;
    for (uint32_t slot = 0; slot < a.num_sequences(); ++slot) {
      const uint64_t b0 = x.sequence_begin[slot], n = x.num_samples(slot);
      if (x.format == StreamFormat::kDense) {
        if (n) {
          ASSERT_EQ(std::memcmp(x.DenseSamples(slot, b0, elem), y.DenseSamples(slot, b0, elem), n * x.dim * elem), 0)
              << where;
        }
        continue;
      }
      const uint64_t kb = x.nnz_begin[b0], ke = x.nnz_begin[b0 + n];
      if (ke > kb) {
        ASSERT_EQ(std::memcmp(x.SparseIndexBytes(slot, kb), y.SparseIndexBytes(slot, kb), (ke - kb) * 4), 0) << where;
        ASSERT_EQ(std::memcmp(x.SparseValueBytes(slot, kb, elem), y.SparseValueBytes(slot, kb, elem), (ke - kb) * elem), 0)
            << where;
      }
    }
  }
}

// The dump without keys and cursors, each sample's sparse entries sorted.
std::string Normalized(const std::string& dump) {
  std::string out;
  size_t pos = 0;
  while (pos < dump.size()) {
    size_t end = dump.find('\n', pos);
    std::string line = dump.substr(pos, end - pos);
    pos = end + 1;
    const size_t k = line.find(",\"key\":\"");
    if (k != std::string::npos) line.erase(k, line.find('"', k + 8) + 1 - k);
    const size_t c = line.find(",\"cursor\":");
    if (c != std::string::npos) line.erase(c, line.size() - 1 - c);
    // Sort the [index,value] pairs inside each sample list "[[i,v],[i,v]]".
    std::string sorted;
    size_t i = 0;
    while (i < line.size()) {
      if (line.compare(i, 2, "[[") == 0 && i + 2 < line.size() && line[i + 2] != '[' && line[i + 2] != ']') {
        const size_t close = line.find("]]", i);
        std::vector<std::pair<long, std::string>> pairs;
        size_t p = i + 1;
        while (p < close + 1) {
          const size_t e = line.find(']', p);
          const std::string pair = line.substr(p + 1, e - p - 1);
          pairs.emplace_back(std::stol(pair.substr(0, pair.find(','))), pair);
          p = e + 2;
        }
        std::sort(pairs.begin(), pairs.end());
        sorted += "[";
        for (size_t n = 0; n < pairs.size(); ++n) sorted += (n ? ",[" : "[") + pairs[n].second + "]";
        sorted += "]";
        i = close + 2;
      } else {
        sorted += line[i++];
      }
    }
    out += sorted + "\n";
  }
  return out;
}

// The dumps of `a` and of `b` with their sparse stream "s" read as CSC, CSR and dense
// (minibatch 16), one entry per layout (a test failure and no entry where a read fails).
struct LayoutDumps {
  const char* layout;
  std::string a, b;
};
std::vector<LayoutDumps> DumpsInEveryLayout(const DatasetConfig& a, const DatasetConfig& b) {
  std::vector<LayoutDumps> out;
  for (OutputLayout layout : {OutputLayout::kCsc, OutputLayout::kCsr, OutputLayout::kDense}) {
    ReadOptions ro;
    ro.minibatch_size = 16;
    ro.request.layouts["s"] = layout;
    auto x = DumpDataset(a, ro);
    auto y = DumpDataset(b, ro);
    if (!x.ok() || !y.ok()) {
      ADD_FAILURE() << OutputLayoutName(layout) << ": " << x.status() << " / " << y.status();
      continue;
    }
    out.push_back({OutputLayoutName(layout), std::move(*x), std::move(*y)});
  }
  return out;
}

struct Case {
  std::string name;  // file stem in both folders
  Precision precision;
  std::string ctf_input;  // the ctf2bin header, as conveyor input
};

class CbfGolden : public ::testing::TestWithParam<Case> {};

TEST_P(CbfGolden, DecodesToWhatTheTextReaderGives) {
  const Case& c = GetParam();
  ReadOptions ro;
  ro.minibatch_size = 64;
  auto bin = DumpDataset(CbfDataset(BinDir() + c.name + ".bin", c.precision), ro);
  ASSERT_TRUE(bin.ok()) << bin.status();
  DatasetConfig text = CtfDataset(TextDir() + c.name + ".txt", c.ctf_input, "randomize: false");
  text.precision = c.precision;
  auto ctf = DumpDataset(text, ro);
  ASSERT_TRUE(ctf.ok()) << ctf.status();
  EXPECT_FALSE(bin->empty());
  EXPECT_EQ(Normalized(*bin), Normalized(*ctf));
}

// conveyor convert (WriteCbf) of the same text with ctf2bin's header writes ctf2bin's bytes.
TEST_P(CbfGolden, ConvertWritesWhatCtf2binWrote) {
  const Case& c = GetParam();
  DatasetConfig text = CtfDataset(TextDir() + c.name + ".txt", c.ctf_input, "randomize: false");
  text.precision = c.precision;
  auto ds = Dataset::Open(text);
  ASSERT_TRUE(ds.ok()) << ds.status();
  TempDir dir;
  const std::string out = dir.path() + "/out.cbf";
  auto stats = WriteCbf(**ds, out, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->chunks, 1u);
  const std::string expected = ReadFile(TestdataDir() + "/cntk/CNTKBinaryReader/ctf2bin/" + c.name + ".bin");
  const std::string got = ReadFile(out);
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "first difference at byte "
                               << (std::mismatch(got.begin(), got.end(), expected.begin(), expected.end()).first - got.begin());
}

INSTANTIATE_TEST_SUITE_P(
    Ctf2binOutputs, CbfGolden,
    ::testing::Values(Case{"Simple_dense", Precision::kFloat,
                           "{features: {alias: F, dim: 2, format: dense}, labels: {alias: L, dim: 2, format: dense}}"},
                      Case{"10x10_dense", Precision::kFloat, "{features: {alias: F0, dim: 5, format: dense}}"},
                      Case{"10x10_sparse", Precision::kDouble, "{features: {alias: F0, dim: 100, format: sparse}}"},
                      Case{"50x20_jagged_sequences_dense", Precision::kDouble,
                           "{features: {alias: F0, dim: 3, format: dense}}"},
                      Case{"50x20_jagged_sequences_sparse", Precision::kFloat,
                           "{features: {alias: F0, dim: 100, format: sparse}}"}),
    [](const auto& p) { return p.param.name; });

TEST(Cbf, ReadsTheHeaderCntkWrote) {
  const std::string bytes = ReadFile(BinDir() + "Simple_jagged_sequence.bin");
  auto file = ReadCbfFile(bytes, "x.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->streams.size(), 8u);
  EXPECT_EQ(file->streams[2].name, "cgw");
  EXPECT_EQ(file->streams[2].format, StreamFormat::kSparse);
  EXPECT_EQ(file->streams[2].dim, 100000u);
  EXPECT_EQ(file->chunks.front().offset, 12u);
  EXPECT_EQ(file->chunks.back().end, file->header_offset);
  auto index = BuildCbfIndex(*file, bytes, "x.bin");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->sequences.size(), 101u);
  EXPECT_EQ(index->total_samples, 14239u);
}

TEST(Cbf, RenamesSelectsAndChecksStreams) {
  const std::string file = BinDir() + "Simple_dense.bin";
  ReadOptions ro;
  ro.minibatch_size = 4;
  ro.max_batches_per_epoch = 1;
  auto one = DumpDataset(CbfDataset(file, Precision::kFloat, "{x: {alias: labels}}"), ro);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NE(one->find("\"streams\":{\"x\":{\"dense\":[[1,0]]}}"), std::string::npos) << *one;
  auto missing = Dataset::Open(CbfDataset(file, Precision::kFloat, "{x: {alias: nope}}"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("(it has: features, labels)"), std::string::npos) << missing.status();
  auto wrong = Dataset::Open(CbfDataset(file, Precision::kFloat, "{x: {alias: labels, format: sparse}}"));
  EXPECT_FALSE(wrong.ok());
  auto precision = Dataset::Open(CbfDataset(file, Precision::kDouble));
  ASSERT_FALSE(precision.ok());
  EXPECT_NE(precision.status().message().find("holds float values but the dataset's precision is double"),
            std::string::npos)
      << precision.status();
}

// CNTK's own test configuration (readerType = "CNTKBinaryReader", precision outside the
// reader block) loads unchanged; its datasets open once pointed at the data folder.
TEST(Cbf, CntkBrainScriptConfigurationsLoad) {
  auto config = LoadConfigFile(TestdataDir() + "/cntk/CNTKBinaryReader/Config/test.cntk");
  ASSERT_TRUE(config.ok()) << config.status();
  int opened = 0;
  for (DatasetConfig d : config->datasets) {
    ASSERT_EQ(d.deserializers.size(), 1u) << d.name;
    EXPECT_EQ(d.deserializers[0].type, "CNTKBinary") << d.name;
    const std::string base = d.deserializers[0].file.substr(d.deserializers[0].file.rfind('/') + 1);
    d.deserializers[0].file = BinDir() + base;
    if (!StatFile(d.deserializers[0].file).ok()) continue;  // MNIST and a few others are not in the test data
    auto ds = Dataset::Open(d);
    ASSERT_TRUE(ds.ok()) << d.name << ": " << ds.status();
    ++opened;
  }
  EXPECT_EQ(opened, 5);
  const DatasetConfig* mixed = config->Find("5_inputs_100x10_jagged_mixed");  // input = [ features1 = [ alias="a" ] ... ]
  ASSERT_NE(mixed, nullptr);
  ASSERT_EQ(mixed->deserializers[0].streams.size(), 5u);
  EXPECT_EQ(mixed->deserializers[0].streams[0].alias, "a");
}

// Small chunks (ctf2bin would make every sequence after the first chunk its own chunk) and
// empty sparse samples (ctf2bin drops them) survive a round trip: text -> CBF -> the same dump.
TEST(Cbf, ConvertKeepsChunkSizesAndEmptySamples) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += std::to_string(i) + " |d " + std::to_string(i) + " " + std::to_string(-i) + " |s " +
            (i % 3 == 0 ? std::string() : std::to_string(i % 50) + ":1.5 " + std::to_string((i * 7) % 50) + ":-2") + "\n";
    if (i % 4 == 0) text += std::to_string(i) + " |d 0.25 0.5\n";  // a second sample, no |s
  }
  DatasetConfig config = CtfDataset(dir.Write("in.ctf", text), "{d: {dim: 2, format: dense}, s: {dim: 50, format: sparse}}",
                                    "randomize: false");
  auto ds = Dataset::Open(config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  CbfWriteOptions wo;
  wo.chunk_size = 1000;
  const std::string out = dir.path() + "/out.cbf";
  auto stats = WriteCbf(**ds, out, wo);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->sequences, 300u);
  EXPECT_GT(stats->chunks, 10u);
  EXPECT_LT(stats->chunks, 60u);  // about 1000 bytes each, not one per sequence
  auto back = Dataset::Open(CbfDataset(out, Precision::kFloat));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->index().chunks.size(), stats->chunks);
  ReadOptions ro;
  ro.minibatch_size = 16;
  auto a = DumpDataset(config, ro);
  auto b = DumpDataset(CbfDataset(out, Precision::kFloat), ro);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Normalized(*a), Normalized(*b));
  EXPECT_NE(a->find("\"s\":{\"sparse\":[[]"), std::string::npos);  // an empty sparse sample, kept
}

// CTF `text` with `inputs` in `precision` (dataset `config`), converted into CBF chunks of
// about `chunk_size` bytes at `cbf_path`; both opened.
struct TextAndCbf {
  DatasetConfig config;
  std::string cbf_path;
  std::unique_ptr<Dataset> text, cbf;
};
void OpenTextAndCbf(TempDir& dir, const std::string& name, const std::string& text, const std::string& inputs,
                    Precision precision, uint64_t chunk_size, TextAndCbf* out) {
  out->config = CtfDataset(dir.Write(name + ".ctf", text), inputs, "randomize: false");
  out->config.precision = precision;
  auto ds = Dataset::Open(out->config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  out->text = *std::move(ds);
  CbfWriteOptions wo;
  wo.chunk_size = chunk_size;
  out->cbf_path = dir.path() + "/" + name + ".cbf";
  ASSERT_TRUE(WriteCbf(*out->text, out->cbf_path, wo).ok());
  auto cbf = Dataset::Open(CbfDataset(out->cbf_path, precision));
  ASSERT_TRUE(cbf.ok()) << cbf.status();
  out->cbf = *std::move(cbf);
}

// ctf2bin's layout: a sparse stream's entries are used where they lie in the mapped file
// (the chunk holds only their per-sample ranges), and read through them they give what the
// text reader gives, as CSC, CSR and dense, in float and double; converting the CBF again
// (the converter reading entries in place) writes the same file.
TEST(Cbf, SparseEntriesAreUsedWhereTheyLie) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) {
    for (int t = 0; t <= i % 3; ++t) {  // sequences of 1-3 samples; entries by ascending index
      text += std::to_string(i) + " |d " + std::to_string(i) + " " + std::to_string(t) + " |s " +
              (i % 5 == 0 ? std::string() : std::to_string(i % 20) + ":1.5 " + std::to_string(20 + (i * 7 + t) % 30) + ":-2") +
              "\n";
    }
  }
  for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
    SCOPED_TRACE(precision == Precision::kFloat ? "float" : "double");
    TextAndCbf d;
    OpenTextAndCbf(dir, "in", text, "{d: {dim: 2, format: dense}, s: {dim: 50, format: sparse}}", precision, 700, &d);
    if (::testing::Test::HasFatalFailure()) return;
    const std::string& out = d.cbf_path;
    ASSERT_GT(d.cbf->index().chunks.size(), 5u);
    auto chunk = d.cbf->ParseChunk(1);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const ParsedStream& sparse = (*chunk)->streams[1];
    EXPECT_EQ(sparse.sparse_values_in_place.size(), (*chunk)->num_sequences());
    EXPECT_EQ(sparse.sparse_indices_in_place.size(), (*chunk)->num_sequences());
    EXPECT_TRUE(sparse.indices.empty() && sparse.values_f32.empty() && sparse.values_f64.empty());
    EXPECT_GT(sparse.total_entries(), 0u);
    const auto dumps = DumpsInEveryLayout(d.config, CbfDataset(out, precision));
    ASSERT_EQ(dumps.size(), 3u);
    for (const LayoutDumps& l : dumps) EXPECT_EQ(l.a, l.b) << l.layout;
    const std::string again = dir.path() + "/again.cbf";
    CbfWriteOptions wo;
    wo.chunk_size = 700;
    ASSERT_TRUE(WriteCbf(*d.cbf, again, wo).ok());
    EXPECT_EQ(ReadFile(again), ReadFile(out));
  }
}

// A randomized gather of CBF entries used where they lie and of the same entries parsed from
// text into columns: the plan says where each piece's entries lie (PlanBatch found them), and
// the CPU assembler copies from there; a plan without that (entries cleared) is assembled from
// the chunks' tables. The four batches are the same bytes, in CSC and CSR.
TEST(Cbf, ARandomGatherIsTheSameWhetherThePlanSaysWhereEntriesLie) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 600; ++i) {
    for (int t = 0; t <= i % 4; ++t) {  // sequences of 1-4 samples, some without entries
      text += std::to_string(i) + " |d " + std::to_string(i) + " |s " +
              (i % 7 == 3 ? std::string() : std::to_string((i * 13 + t) % 40) + ":0.25 " + std::to_string(40 + i % 9) + ":3") +
              "\n";
    }
  }
  for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
    SCOPED_TRACE(precision == Precision::kFloat ? "float" : "double");
    TextAndCbf d;
    OpenTextAndCbf(dir, "g", text, "{d: {dim: 1, format: dense}, s: {dim: 50, format: sparse}}", precision, 900, &d);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_GT(d.cbf->index().chunks.size(), 8u);
    // Every sequence of each dataset, one piece a row, rows in a shuffled order.
    std::vector<uint32_t> row(600);
    for (uint32_t i = 0; i < row.size(); ++i) row[i] = i;
    std::mt19937 rng(5);
    std::shuffle(row.begin(), row.end(), rng);
    auto batch = [&](const Dataset& ds, OutputLayout layout, bool with_entries) {
      std::vector<std::unique_ptr<ParsedChunk>> chunks;
      std::vector<PieceRef> pieces;
      for (uint64_t c = 0; c < ds.index().chunks.size(); ++c) {
        auto chunk = ds.ParseChunk(c);
        EXPECT_TRUE(chunk.ok()) << chunk.status();
        if (!chunk.ok()) return std::vector<std::byte>();
        for (uint32_t k = 0; k < (*chunk)->num_sequences(); ++k) {
          PieceRef p;
          p.chunk = chunk->get();
          p.slot = k;
          p.row = 0;
          pieces.push_back(p);
        }
        chunks.push_back(*std::move(chunk));
      }
      EXPECT_EQ(pieces.size(), row.size());
      if (pieces.size() != row.size()) return std::vector<std::byte>();
      std::vector<PieceRef> shuffled(pieces.size());
      for (size_t i = 0; i < pieces.size(); ++i) {
        shuffled[row[i]] = pieces[i];
        shuffled[row[i]].row = row[i];
      }
      // Read in row order: each piece from a random place (a scattered gather, prefetched).
      BatchShape shape;
      shape.rows = static_cast<uint32_t>(row.size());
      const std::vector<OutputLayout> layouts{OutputLayout::kNative, layout};
      auto plan = PlanBatch(ds.streams(), precision, shape, shuffled, layouts);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (!plan.ok()) return std::vector<std::byte>();
      EXPECT_EQ(plan->entries.size(), shuffled.size() * 2);
      if (!with_entries) plan->entries.clear();
      std::vector<std::byte> bytes(plan->total_bytes, std::byte{0x5A});
      absl::Status st = MakeCpuAssembler()->Assemble(*plan, shuffled, absl::MakeSpan(bytes));
      EXPECT_TRUE(st.ok()) << st;
      return bytes;
    };
    for (OutputLayout layout : {OutputLayout::kCsc, OutputLayout::kCsr}) {
      SCOPED_TRACE(OutputLayoutName(layout));
      const std::vector<std::byte> want = batch(*d.text, layout, false);
      ASSERT_FALSE(want.empty());
      EXPECT_EQ(batch(*d.text, layout, true), want);
      EXPECT_EQ(batch(*d.cbf, layout, true), want);
      EXPECT_EQ(batch(*d.cbf, layout, false), want);
    }
  }
}

// Every prefix and a corruption of every byte of a real file: open and read it all; each
// outcome is either a complete read or an error naming the file. (ASan/UBSan builds and the
// fuzzer make "never out of bounds" checkable; here it must at least never crash or hang.)
TEST(Cbf, EveryTruncationAndCorruptionIsAnErrorOrARead) {
  const std::string good = ReadFile(BinDir() + "10x10_sparse.bin");
  TempDir dir;
  auto read_all = [&](const std::string& bytes) -> absl::Status {
    const std::string path = dir.Write("f.bin", bytes);
    ReadOptions ro;
    ro.minibatch_size = 7;
    auto out = DumpDataset(CbfDataset(path, Precision::kDouble), ro);
    if (!out.ok() && out.status().message().find("f.bin") == std::string::npos) {
      return absl::InternalError(absl::StrCat("error without the file's name: ", out.status().message()));
    }
    return absl::OkStatus();
  };
  size_t failures = 0;
  for (size_t n = 0; n < good.size(); n += 7) {
    absl::Status st = read_all(good.substr(0, n));
    if (!st.ok()) ++failures;
    ASSERT_TRUE(st.ok()) << "prefix " << n << ": " << st;
  }
  for (size_t i = 0; i < good.size(); i += 3) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    absl::Status st = read_all(bad);
    ASSERT_TRUE(st.ok()) << "byte " << i << ": " << st;
  }
  EXPECT_EQ(failures, 0u);
}


// ctf2bin's layout is decoded by one tight pass per stream that asks the checked walk (the
// listing's, CountCbfChunk) why when it refuses a chunk: the two must accept exactly the same
// chunks. Each real file, indexed intact, then each byte of its chunks damaged in four ways
// (the file changed after indexing): the decode and the listing give the same status and
// message, and where both accept, the same samples per sequence and stream.
TEST(Cbf, TheDecoderAcceptsExactlyWhatTheListingAccepts) {
  for (const char* name : {"10x10_sparse", "10x10_dense", "50x20_jagged_sequences_sparse",
                           "50x20_jagged_sequences_dense", "Simple_jagged_sequence"}) {
    SCOPED_TRACE(name);
    const std::string good = ReadFile(BinDir() + name + ".bin");
    std::string bad = good;  // damaged one byte at a time, restored after
    auto file = ReadCbfFile(good, "f.bin");
    ASSERT_TRUE(file.ok()) << file.status();
    auto index = BuildCbfIndex(*file, good, "f.bin");
    ASSERT_TRUE(index.ok()) << index.status();
    const Precision precision = file->streams[0].precision;
    // Every stream delivered; and, skipped streams still checked, the last one alone.
    const std::vector<std::vector<int>> sources = {
        [&] {
          std::vector<int> all(file->streams.size());
          for (size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int>(s);
          return all;
        }(),
        {static_cast<int>(file->streams.size()) - 1}};
    const uint64_t stride = good.size() > 100000 ? 61 : 1;
    size_t refused = 0, accepted = 0;
    for (uint64_t i = file->chunks[0].offset; i < file->header_offset; i += stride) {
      uint64_t c = 0;
      while (file->chunks[c].end <= i) ++c;
      for (int flip : {0x01, 0x40, 0x80, 0xFF}) {
        bad[i] = static_cast<char>(good[i] ^ flip);
        for (const std::vector<int>& source : sources) {
          auto parsed = ParseCbfChunk(bad, *file, *index, c, source, precision, "f.bin");
          CbfChunkCounts counts;
          const absl::Status listed = CountCbfChunk(bad, *file, *index, c, source, precision, "f.bin", &counts);
          ASSERT_EQ(parsed.status(), listed) << "byte " << i << " ^ " << flip;
          // The chunk read alone (as the deserializer reads it) decodes as in the whole file,
          // errors and their byte offsets included.
          const CbfChunkInfo& ci = file->chunks[c];
          const std::string alone = bad.substr(ci.offset, ci.end - ci.offset);
          auto read = ParseCbfChunk(alone, ci.offset, *file, *index, c, source, precision, "f.bin");
          ASSERT_EQ(read.status(), parsed.status()) << "byte " << i << " ^ " << flip;
          if (read.ok()) ExpectSameChunk(**parsed, **read, absl::StrCat("byte ", i, " ^ ", flip));
          if (!listed.ok()) {
            ++refused;
            continue;
          }
          ++accepted;
          ASSERT_EQ((*parsed)->slot_of, counts.slot_of) << "byte " << i << " ^ " << flip;
          for (size_t k = 0, slot = 0; slot < (*parsed)->num_sequences(); ++slot) {
            for (const ParsedStream& ps : (*parsed)->streams) {
              ASSERT_EQ(ps.num_samples(slot), counts.samples[k++]) << "byte " << i << " ^ " << flip;
            }
          }
        }
      }
      bad[i] = good[i];
    }
    EXPECT_GT(refused, 100u);
    EXPECT_GT(accepted, 100u);
  }
}

// ---- The documented layout ("BrainScript CNTK Binary Reader"): header, offsets table, data.

template <typename V>
void Put(std::string* out, V v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(V));
}

// Writes `dataset`'s chunks in the documented layout, independently of the reader: every
// dataset chunk one file chunk, values in the dataset's precision; dense streams must hold
// one sample a sequence; sparse streams are written with `is_sequence` (when false, each
// sequence must have one sample), rows coded sample * dim + index.
std::string WriteDocumented(const Dataset& dataset, bool is_sequence = true) {
  std::string header, table, data;
  const auto& streams = dataset.streams();
  const bool f64 = dataset.config().precision == Precision::kDouble;
  Put<int64_t>(&header, 1);
  Put<int64_t>(&header, static_cast<int64_t>(dataset.index().chunks.size()));
  Put<int32_t>(&header, static_cast<int32_t>(streams.size()));
  for (const StreamConfig& sc : streams) {
    Put<int32_t>(&header, static_cast<int32_t>(sc.name.size()));
    header += sc.name;
    const bool sparse = sc.format == StreamFormat::kSparse;
    Put<int32_t>(&header, sparse ? 1 : 0);
    if (sparse) Put<int32_t>(&header, 0);  // storage: CSC
    Put<int32_t>(&header, f64 ? 1 : 0);    // float or double
    if (sparse) Put<int32_t>(&header, is_sequence ? 1 : 0);
    Put<int32_t>(&header, static_cast<int32_t>(sc.dim));
  }
  const size_t elem = f64 ? 8 : 4;
  for (uint64_t c = 0; c < dataset.index().chunks.size(); ++c) {
    auto parsed = dataset.ParseChunk(c);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    const ParsedChunk& pc = **parsed;
    Put<int64_t>(&table, static_cast<int64_t>(data.size()));
    Put<int32_t>(&table, static_cast<int32_t>(pc.num_sequences()));
    int32_t samples = 0;
    for (uint32_t len : pc.lengths) samples += static_cast<int32_t>(len);
    Put<int32_t>(&table, samples);
    for (const ParsedStream& ps : pc.streams) {
      if (ps.format == StreamFormat::kDense) {
        EXPECT_EQ(ps.total_samples(), pc.num_sequences());
        for (uint32_t seq = 0; seq < pc.num_sequences(); ++seq) {
          data.append(reinterpret_cast<const char*>(ps.DenseSamples(seq, seq, elem)), ps.dim * elem);
        }
        continue;
      }
      Put<int32_t>(&data, static_cast<int32_t>(ps.indices.size()));
      if (f64) data.append(reinterpret_cast<const char*>(ps.values_f64.data()), ps.values_f64.size() * 8);
      else data.append(reinterpret_cast<const char*>(ps.values_f32.data()), ps.values_f32.size() * 4);
      for (uint64_t seq = 0; seq < pc.num_sequences(); ++seq) {
        if (!is_sequence) {
          EXPECT_EQ(ps.num_samples(seq), 1u);
        }
        for (uint64_t t = ps.sequence_begin[seq]; t < ps.sequence_begin[seq + 1]; ++t) {
          for (uint64_t k = ps.nnz_begin[t]; k < ps.nnz_begin[t + 1]; ++k) {
            Put<int32_t>(&data, static_cast<int32_t>((t - ps.sequence_begin[seq]) * ps.dim) + ps.indices[k]);
          }
        }
      }
      for (uint64_t seq = 0; seq <= pc.num_sequences(); ++seq) {
        Put<int32_t>(&data, static_cast<int32_t>(ps.nnz_begin[ps.sequence_begin[seq]]));
      }
    }
  }
  return header + table + data;
}

// A file written by hand from the documentation, decoded value by value. Input `x` dense
// dim 2; input `y` sparse dim 5, a sequence, its entries of sequence 0 not in sample order.
std::string HandWrittenDocumented() {
  std::string f;
  Put<int64_t>(&f, 1);  // version
  Put<int64_t>(&f, 2);  // chunks
  Put<int32_t>(&f, 2);  // inputs
  Put<int32_t>(&f, 1), f += "x", Put<int32_t>(&f, 0), Put<int32_t>(&f, 0), Put<int32_t>(&f, 2);
  Put<int32_t>(&f, 1), f += "y", Put<int32_t>(&f, 1), Put<int32_t>(&f, 0), Put<int32_t>(&f, 0), Put<int32_t>(&f, 1),
      Put<int32_t>(&f, 5);
  std::string c0, c1;
  // Chunk 0: sequence 0 = x [1 2], y {sample 2: row 1 = -1; sample 0: row 3 = 0.5} (3 samples);
  //          sequence 1 = x [3 4], y nothing (1 sample).
  for (float v : {1.f, 2.f, 3.f, 4.f}) Put<float>(&c0, v);
  Put<int32_t>(&c0, 2), Put<float>(&c0, -1.f), Put<float>(&c0, 0.5f), Put<int32_t>(&c0, 2 * 5 + 1),
      Put<int32_t>(&c0, 0 * 5 + 3);
  Put<int32_t>(&c0, 0), Put<int32_t>(&c0, 2), Put<int32_t>(&c0, 2);
  // Chunk 1: one sequence, x [5 6], y sample 0: row 4 = 3, row 0 = 2 (file order kept).
  Put<float>(&c1, 5.f), Put<float>(&c1, 6.f);
  Put<int32_t>(&c1, 2), Put<float>(&c1, 3.f), Put<float>(&c1, 2.f), Put<int32_t>(&c1, 4), Put<int32_t>(&c1, 0);
  Put<int32_t>(&c1, 0), Put<int32_t>(&c1, 2);
  Put<int64_t>(&f, 0), Put<int32_t>(&f, 2), Put<int32_t>(&f, 4);
  Put<int64_t>(&f, static_cast<int64_t>(c0.size())), Put<int32_t>(&f, 1), Put<int32_t>(&f, 1);
  return f + c0 + c1;
}

// The decoders' bulk index check: [0, dim) for any dim a header may claim. A dim past 2^31
// once let a negative index pass (compared as unsigned: below 4227858532), where the
// listing refused it (found by cbf_fuzzer; its input is in the corpus). Each variant (one,
// 4 and 8 at a time; AVX2 where this processor has it) and the dispatch, at counts below,
// at and past each width, a bad index at every place (the overlapping last load included).
TEST(Cbf, IndicesBelowRefusesNegativeIndicesWhateverTheDim) {
  using Check = bool (*)(const char*, uint64_t, uint32_t);
  std::vector<std::pair<std::string, Check>> variants = {{"dispatch", cbf::IndicesBelow},
                                                         {"scalar", cbf::detail::IndicesBelowScalar}};
#if defined(__SSE2__)
  variants.emplace_back("sse2", cbf::detail::IndicesBelowSse2);
#endif
#if defined(CONVEYOR_CBF_AVX2)
  if (__builtin_cpu_supports("avx2")) {
    variants.emplace_back("avx2", cbf::detail::IndicesBelowAvx2);
  } else {
    std::cout << "this processor has no AVX2: its variant is not checked here\n";
  }
#endif
  for (const auto& [name, check] : variants) {
    // No index at all passes; so do indices at any alignment (a sequence's lie after its values).
    EXPECT_TRUE(check(nullptr, 0, 1)) << name;
    {
      std::vector<char> bytes(4 * 20 + 3, 0);
      for (size_t shift = 0; shift < 4; ++shift) {
        EXPECT_TRUE(check(bytes.data() + shift, 20, 1)) << name << ", offset " << shift;
        bytes[shift + 4 * 19 + 3] = '\x80';  // the last index negative
        EXPECT_FALSE(check(bytes.data() + shift, 20, 1)) << name << ", offset " << shift;
        bytes[shift + 4 * 19 + 3] = 0;
      }
    }
    for (uint32_t dim : {1u, 7u, 0x7fffffffu, 0x80000000u, 0x80000001u, 4227858532u, 0xffffffffu}) {
      for (uint64_t count : {1u, 3u, 4u, 5u, 7u, 8u, 9u, 15u, 16u, 17u, 33u}) {
        for (uint64_t bad = 0; bad < count; ++bad) {
          SCOPED_TRACE(::testing::Message() << name << ": dim " << dim << ", count " << count << ", bad " << bad);
          std::vector<int32_t> v(count, 0);
          EXPECT_TRUE(check(reinterpret_cast<const char*>(v.data()), count, dim));
          v[bad] = -1627389935;
          EXPECT_FALSE(check(reinterpret_cast<const char*>(v.data()), count, dim));
          v[bad] = -1;
          EXPECT_FALSE(check(reinterpret_cast<const char*>(v.data()), count, dim));
          v[bad] = static_cast<int32_t>(std::min<uint32_t>(dim - 1, 0x7fffffff));
          EXPECT_TRUE(check(reinterpret_cast<const char*>(v.data()), count, dim));
          if (dim <= 0x7fffffffu) {
            v[bad] = static_cast<int32_t>(dim);
            EXPECT_FALSE(check(reinterpret_cast<const char*>(v.data()), count, dim));
          }
        }
      }
    }
  }
}

// The deserializer reads each chunk into memory of its own (chunked_file.h): every chunk of
// both layouts, read alone, decodes as it does in the whole file.
TEST(Cbf, EveryChunkReadAloneDecodesAsInTheWholeFile) {
  std::vector<std::pair<std::string, std::string>> files = {{"documented", HandWrittenDocumented()}};
  for (const char* name : {"10x10_sparse", "10x10_dense", "50x20_jagged_sequences_sparse", "Simple_jagged_sequence"}) {
    files.emplace_back(name, ReadFile(BinDir() + name + ".bin"));
  }
  for (const auto& [name, bytes] : files) {
    SCOPED_TRACE(name);
    auto file = ReadCbfFile(bytes, "f.bin");
    ASSERT_TRUE(file.ok()) << file.status();
    auto index = BuildCbfIndex(*file, bytes, "f.bin");
    ASSERT_TRUE(index.ok()) << index.status();
    std::vector<int> all(file->streams.size());
    for (size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int>(s);
    for (uint64_t c = 0; c < file->chunks.size(); ++c) {
      const CbfChunkInfo& ci = file->chunks[c];
      auto whole = ParseCbfChunk(bytes, *file, *index, c, all, file->streams[0].precision, "f.bin");
      ASSERT_TRUE(whole.ok()) << whole.status();
      const std::string alone = bytes.substr(ci.offset, ci.end - ci.offset);
      auto read = ParseCbfChunk(alone, ci.offset, *file, *index, c, all, file->streams[0].precision, "f.bin");
      ASSERT_TRUE(read.ok()) << read.status();
      ExpectSameChunk(**whole, **read, absl::StrCat("chunk ", c));
      // Bytes that do not hold the chunk are refused, not read out of bounds.
      EXPECT_EQ(ParseCbfChunk(alone.substr(0, alone.size() - 1), ci.offset, *file, *index, c, all,
                              file->streams[0].precision, "f.bin").status().code(),
                absl::StatusCode::kInternal);
      EXPECT_EQ(ParseCbfChunk(alone, ci.offset + 1, *file, *index, c, all, file->streams[0].precision, "f.bin")
                    .status().code(),
                absl::StatusCode::kInternal);
    }
  }
}

// A conversion that fails on the way (here: its input cut short after it was opened) leaves
// neither the output nor its partial OUTPUT.tmp behind.
TEST(Cbf, AFailedConvertLeavesNoPartialFile) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 2000; ++i) text += std::to_string(i) + " |d " + std::to_string(i) + "\n";
  const std::string in = dir.Write("in.ctf", text);
  DatasetConfig config = CtfDataset(in, "{d: {dim: 1, format: dense}}", "randomize: false");
  config.deserializers[0].chunk_size_in_bytes = 1024;
  auto ctf = Dataset::Open(config);
  ASSERT_TRUE(ctf.ok()) << ctf.status();
  ASSERT_EQ(::truncate(in.c_str(), static_cast<off_t>(text.size() / 2)), 0);
  const std::string out = dir.path() + "/out.cbf";
  auto stats = WriteCbf(**ctf, out, {});
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
  EXPECT_NE(::access(out.c_str(), F_OK), 0);
  EXPECT_NE(::access((out + ".tmp").c_str(), F_OK), 0) << "the partial file was left";
}

// A file cut short after it was opened: the chunks past the cut are an error naming the file
// and what happened, not a SIGBUS from a mapping past its end.
TEST(Cbf, AFileCutShortAfterOpeningIsAnErrorNotACrash) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text += std::to_string(i) + " |d " + std::to_string(i) + " |s " + std::to_string(i % 9) + ":1\n";
  auto ctf = Dataset::Open(CtfDataset(dir.Write("in.ctf", text), "{d: {dim: 1, format: dense}, s: {dim: 9, format: sparse}}",
                                      "randomize: false"));
  ASSERT_TRUE(ctf.ok()) << ctf.status();
  CbfWriteOptions wo;
  wo.chunk_size = 300;
  const std::string path = dir.path() + "/cut.bin";
  ASSERT_TRUE(WriteCbf(**ctf, path, wo).ok());
  ChunkEntry last;
  const absl::Status cut = ParseTheLastChunkOfAFileCutShort(CbfDataset(path, Precision::kFloat), 3, &last);
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss) << cut;
  EXPECT_NE(cut.message().find("cut.bin: the file ends at byte " + std::to_string(last.begin_offset + 3)), std::string::npos)
      << cut;
  EXPECT_NE(cut.message().find("changed or truncated"), std::string::npos) << cut;
}

TEST(CbfDocumented, DecodesAHandWrittenFile) {
  TempDir dir;
  const std::string path = dir.Write("doc.bin", HandWrittenDocumented());
  auto ds = Dataset::Open(CbfDataset(path, Precision::kFloat));
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->streams().size(), 2u);
  EXPECT_EQ((*ds)->streams()[1].format, StreamFormat::kSparse);
  EXPECT_EQ((*ds)->index().sequences.size(), 3u);
  EXPECT_EQ((*ds)->index().total_samples, 5u);
  auto c0 = (*ds)->ParseChunk(0);
  ASSERT_TRUE(c0.ok()) << c0.status();
  EXPECT_EQ((*c0)->lengths, (HugeVector<uint32_t>{3, 1}));
  const ParsedStream& x = (*c0)->streams[0];
  ASSERT_EQ(x.in_place.size(), 2u);  // dense values used where they lie in the file
  EXPECT_TRUE(x.values_f32.empty());
  // ... as read: the chunk holds its bytes, counted as its memory.
  const HugeBytes& held = (*c0)->file_bytes;
  EXPECT_EQ(held.size(), (*ds)->index().chunks[0].end_offset - (*ds)->index().chunks[0].begin_offset);
  for (const std::byte* p : x.in_place) {
    EXPECT_TRUE(reinterpret_cast<const char*>(p) >= held.data() && reinterpret_cast<const char*>(p) < held.data() + held.size());
  }
  EXPECT_GE((*c0)->MemoryBytes(), held.size());
  float xs[4];
  std::memcpy(xs, x.DenseSamples(0, 0, 4), 8);
  std::memcpy(xs + 2, x.DenseSamples(1, 1, 4), 8);
  EXPECT_EQ(std::vector<float>(xs, xs + 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(x.sequence_begin, (HugeVector<uint64_t>{0, 1, 2}));
  const ParsedStream& y = (*c0)->streams[1];
  EXPECT_EQ(y.sequence_begin, (HugeVector<uint64_t>{0, 3, 3}));
  EXPECT_EQ(y.nnz_begin, (HugeVector<uint64_t>{0, 1, 1, 2}));  // samples 0, 1 (empty), 2
  EXPECT_EQ(y.indices, (HugeVector<int32_t>{3, 1}));
  EXPECT_EQ(y.values_f32, (HugeVector<float>{0.5f, -1.f}));
  EXPECT_TRUE(y.sparse_values_in_place.empty());  // entries of sample 2: sorted into columns
  // Chunk 1's entries are all in sample 0: used where they lie (row code = index).
  auto c1 = (*ds)->ParseChunk(1);
  ASSERT_TRUE(c1.ok()) << c1.status();
  const ParsedStream& y1 = (*c1)->streams[1];
  ASSERT_EQ(y1.sparse_values_in_place.size(), 1u);
  EXPECT_TRUE(y1.indices.empty() && y1.values_f32.empty());
  EXPECT_EQ(y1.sequence_begin, (HugeVector<uint64_t>{0, 1}));
  EXPECT_EQ(y1.nnz_begin, (HugeVector<uint64_t>{0, 2}));
  EXPECT_EQ(y1.SparseIndex(0, 0), 4);
  EXPECT_EQ(y1.SparseIndex(0, 1), 0);
  EXPECT_EQ(y1.SparseValue<float>(0, 0), 3.f);
  EXPECT_EQ(y1.SparseValue<float>(0, 1), 2.f);
  // And through the whole read path.
  ReadOptions ro;
  ro.minibatch_size = 100;
  auto dump = DumpDataset(CbfDataset(path, Precision::kFloat), ro);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_NE(dump->find("\"x\":{\"dense\":[[1,2]]},\"y\":{\"sparse\":[[[3,0.5]],[],[[1,-1]]]}"), std::string::npos) << *dump;
  EXPECT_NE(dump->find("\"y\":{\"sparse\":[[[4,3],[0,2]]]}"), std::string::npos) << *dump;
}

// Text -> the documented layout (written by the test) -> the same dump as the text.
TEST(CbfDocumented, RoundTripsCntkTestData) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"MNIST_dense", "{labels: {alias: L, dim: 10, format: dense}, features: {alias: F, dim: 784, format: dense}}"},
      {"50x20_jagged_sequences_sparse", "{features: {alias: F0, dim: 100, format: sparse}}"}};
  for (const auto& [name, input] : cases) {
    SCOPED_TRACE(name);
    DatasetConfig text = CtfDataset(TextDir() + name + ".txt", input, "randomize: false");
    auto ds = Dataset::Open(text);
    ASSERT_TRUE(ds.ok()) << ds.status();
    TempDir dir;
    const std::string path = dir.Write("doc.bin", WriteDocumented(**ds));
    ReadOptions ro;
    ro.minibatch_size = 32;
    auto a = DumpDataset(text, ro);
    auto b = DumpDataset(CbfDataset(path, Precision::kFloat), ro);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_GT(a->size(), 1000u);
    EXPECT_EQ(Normalized(*a), Normalized(*b));
  }
}

// One-sample sparse sequences (an input that is not a sequence, or a sequence input whose
// entries are all in sample 0): their entries are used where they lie in the file, row code =
// index, and read through them they give what the text gives, as CSC, CSR and dense, in
// float and double, with entries out of index order, repeated indices and sequences without
// entries (an empty sample of an input that is not a sequence; none of one that is).
TEST(CbfDocumented, SampleZeroEntriesAreUsedWhereTheyLie) {
  TempDir dir;
  for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
    for (bool is_sequence : {false, true}) {
      SCOPED_TRACE(absl::StrCat(precision == Precision::kFloat ? "float" : "double", is_sequence ? ", sequence" : ""));
      std::string text;
      for (int i = 0; i < 120; ++i) {
        text += std::to_string(i) + " |d " + std::to_string(i) + " 0.5";
        if (i % 7 != 3) {
          text += " |s " + std::to_string(40 - i % 40) + ":1.5 " + std::to_string(i % 13) + ":-2 " +
                  std::to_string(i % 13) + ":0.25";
        } else if (!is_sequence) {
          text += " |s";  // an empty sample
        }
        text += "\n";
      }
      DatasetConfig config = CtfDataset(dir.Write("in.ctf", text), "{d: {dim: 2, format: dense}, s: {dim: 50, format: sparse}}",
                                        "randomize: false");
      config.precision = precision;
      auto ds = Dataset::Open(config);
      ASSERT_TRUE(ds.ok()) << ds.status();
      const std::string path = dir.Write("doc.bin", WriteDocumented(**ds, is_sequence));
      auto back = Dataset::Open(CbfDataset(path, precision));
      ASSERT_TRUE(back.ok()) << back.status();
      auto chunk = (*back)->ParseChunk(0);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      const ParsedStream& s = (*chunk)->streams[1];
      EXPECT_EQ(s.sparse_values_in_place.size(), (*chunk)->num_sequences());
      EXPECT_TRUE(s.indices.empty() && s.values_f32.empty() && s.values_f64.empty());
      EXPECT_EQ(s.total_entries(), (120u - 17u) * 3);  // i % 7 == 3: 17 without entries
      EXPECT_EQ(s.total_samples(), is_sequence ? 103u : 120u);
      const auto dumps = DumpsInEveryLayout(config, CbfDataset(path, precision));
      ASSERT_EQ(dumps.size(), 3u);
      for (const LayoutDumps& d : dumps) {
        SCOPED_TRACE(d.layout);
        EXPECT_GT(d.a.size(), 1000u);
        EXPECT_EQ(Normalized(d.a), Normalized(d.b));
      }
    }
  }
}

TEST(CbfDocumented, CorruptFilesAreErrorsNamingFileChunkAndByte) {
  const std::string good = HandWrittenDocumented();
  TempDir dir;
  auto open = [&](const std::string& bytes) {
    ReadOptions ro;
    ro.minibatch_size = 2;
    return DumpDataset(CbfDataset(dir.Write("d.bin", bytes), Precision::kFloat), ro).status();
  };
  ASSERT_TRUE(open(good).ok());
  // Every prefix and every corrupted byte: a read or an error naming the file, never a crash.
  for (size_t n = 0; n < good.size(); ++n) {
    absl::Status st = open(good.substr(0, n));
    ASSERT_FALSE(st.ok()) << "prefix " << n;  // every byte of this file matters
    EXPECT_NE(st.message().find("d.bin"), std::string::npos) << st;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    for (int flip : {0x01, 0x80, 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      absl::Status st = open(bad);
      if (!st.ok()) {
        EXPECT_NE(st.message().find("d.bin"), std::string::npos) << "byte " << i << ": " << st;
      }
    }
  }
  // Specific damage, specific messages.
  const size_t c0 = good.size() - 36 - 48;  // chunk 0's data
  std::string wrong_samples = good;
  wrong_samples[8 + 8 + 4 + 17 + 25 + 12] = 5;  // chunk 0 claims 5 samples, its sequences hold 4
  absl::Status st = open(wrong_samples);
  EXPECT_NE(st.message().find("chunk 0, byte " + std::to_string(c0) + ": its sequences hold 4 samples, the offsets table says 5"),
            std::string::npos)
      << st;
  std::string not_seq = good;
  not_seq[8 + 8 + 4 + 17 + 17] = 0;  // y: isSequence 0, but sequence 0 has entries in sample 2
  st = open(not_seq);
  EXPECT_NE(st.message().find("input 'y': row code 11 is outside [0, 5)"), std::string::npos) << st;
}

// ---- A CBF file as a member of a composite: its sequences listed at open from the counts the
// file states (CountCbfChunk), not by parsing its chunks.

// The precision of the CBF file at `path` (its first stream's).
Precision FilePrecision(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  if (!mapped.ok()) return Precision::kFloat;
  auto file = ReadCbfFile((*mapped)->bytes(), path);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->streams[0].precision : Precision::kFloat;
}

// The file of `config` (one CNTKBinary deserializer) opened as a member: it must list exactly
// the sequences, keys, per-stream samples and bytes that parsing each chunk gives, having
// parsed none. `dropped`: how many sequences the parse drops, where the test knows.
void ExpectMemberListsAsTheParse(const DatasetConfig& config,
                                 std::optional<size_t> dropped = std::nullopt) {
  auto alone = Dataset::Open(config);
  ASSERT_TRUE(alone.ok()) << alone.status();
  DatasetOpenOptions options;
  DeserializerContext context{config.deserializers[0], config, "", nullptr, nullptr, {}, options,
                              /*member=*/true};
  auto opened = DeserializerRegistry::Global().Open(context);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const auto* member = dynamic_cast<const ChunkedFileDeserializer*>(opened->get());
  ASSERT_NE(member, nullptr);
  EXPECT_EQ(member->chunks_parsed(), 0u);
  const Index& index = (*alone)->index();
  size_t i = 0, skipped = 0;
  for (uint64_t c = 0; c < index.chunks.size(); ++c) {
    auto chunk = (*alone)->ParseChunk(c);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const ChunkEntry& ce = index.chunks[c];
    for (uint32_t j = 0; j < ce.num_sequences; ++j) {
      const int32_t slot = (*chunk)->slot_of[j];
      if (slot < 0) {
        ++skipped;
        continue;
      }
      ASSERT_LT(i, member->size());
      EXPECT_EQ(member->key(i), std::to_string((*chunk)->keys[slot])) << i;
      for (size_t k = 0; k < (*chunk)->streams.size(); ++k) {
        EXPECT_EQ(member->samples(i, k), (*chunk)->streams[k].num_samples(slot)) << i << " " << k;
      }
      EXPECT_EQ(member->bytes(i), (ce.end_offset - ce.begin_offset) / ce.num_sequences) << i;
      EXPECT_EQ(member->ParseUnit(i), static_cast<int64_t>(c));
      ++i;
    }
  }
  EXPECT_EQ(member->size(), i);
  EXPECT_EQ(member->skipped(), skipped);
  if (dropped) {
    EXPECT_EQ(skipped, *dropped);
  }
  EXPECT_EQ(member->chunks_parsed(), 0u);
}

// The file joined with itself (its stream `stream` again as `dup`) dumps as the file read
// alone in file order, `dup` a copy of `stream` in every line.
void ExpectSelfJoinDumpsAsTheFile(const std::string& path, const std::string& stream) {
  TempDir dir;
  const Precision precision = FilePrecision(path);
  const std::string yaml = absl::StrCat(
      "datasets:\n  d:\n    randomize: false\n    precision: ",
      precision == Precision::kFloat ? "float" : "double", "\n    deserializers:\n",
      "      - type: CNTKBinary\n        file: ", path, "\n",
      "      - type: CNTKBinary\n        file: ", path, "\n",
      "        input: {dup: {alias: ", stream, "}}\n");
  auto config = LoadConfigFile(dir.Write("c.yaml", yaml));
  ASSERT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = 64;
  auto joined = DumpDataset(config->datasets[0], ro);
  auto alone = DumpDataset(CbfDataset(path, precision), ro);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(alone.ok()) << alone.status();
  // Each line of the join: the file's line with ,"dup":X before its closing "}}".
  std::string stripped;
  size_t lines = 0;
  for (size_t pos = 0; pos < joined->size(); ++lines) {
    const size_t end = joined->find('\n', pos);
    const std::string line = joined->substr(pos, end - pos);
    pos = end + 1;
    const size_t at = line.find(",\"dup\":");
    ASSERT_NE(at, std::string::npos) << line;
    const std::string dup = line.substr(at + 7, line.size() - 2 - (at + 7));
    EXPECT_NE(line.find(absl::StrCat("\"", stream, "\":", dup)), std::string::npos) << line;
    stripped += line.substr(0, at) + "}}\n";
  }
  EXPECT_GT(lines, 1u);
  EXPECT_EQ(stripped, *alone);
}

TEST(CbfMember, CtfToBinFilesAreListedWithoutParsing) {
  for (const char* sub : {"CNTKBinaryReader/Data/", "CNTKBinaryReader/ctf2bin/"}) {
    for (const char* name :
         {"10x10_dense", "10x10_sparse", "50x20_jagged_sequences_dense",
          "50x20_jagged_sequences_sparse", "Simple_dense", "Simple_jagged_sequence"}) {
      const std::string path = absl::StrCat(TestdataDir(), "/cntk/", sub, name, ".bin");
      if (!MappedFile::Open(path).ok()) continue;  // ctf2bin/ holds some of them
      SCOPED_TRACE(path);
      ExpectMemberListsAsTheParse(CbfDataset(path, FilePrecision(path)));
      auto ds = Dataset::Open(CbfDataset(path, FilePrecision(path)));
      ASSERT_TRUE(ds.ok()) << ds.status();
      ExpectSelfJoinDumpsAsTheFile(path, (*ds)->streams()[0].name);
    }
  }
}

// A sequence with no sample in the delivered streams is not delivered: the listing drops
// the same ones as the parse.
TEST(CbfMember, SequencesWithoutSamplesAreDroppedAsTheParseDrops) {
  TempDir dir;
  const std::string text =
      dir.Write("t.ctf", "0 |x 1 2 |y 1:1\n1 |y 2:1\n1 |y 3:1\n2 |x 5 6\n3 |y 0:1\n");
  auto ds = Dataset::Open(CtfDataset(
      text, "{x: {dim: 2, format: dense}, y: {dim: 5, format: sparse}}", "randomize: false"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  const std::string path = dir.path() + "/t.cbf";
  ASSERT_TRUE(WriteCbf(**ds, path, {}).ok());
  // Sequences 1 and 3 have y only, 2 has x only.
  ExpectMemberListsAsTheParse(CbfDataset(path, Precision::kFloat, "{x: {}}"), 2);
  ExpectMemberListsAsTheParse(CbfDataset(path, Precision::kFloat, "{y: {}}"), 1);
  ExpectMemberListsAsTheParse(CbfDataset(path, Precision::kFloat), 0);
}

TEST(CbfMember, DocumentedLayoutFilesAreListedWithoutParsing) {
  TempDir dir;
  ExpectMemberListsAsTheParse(
      CbfDataset(dir.Write("hand.bin", HandWrittenDocumented()), Precision::kFloat));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"MNIST_dense",
       "{labels: {alias: L, dim: 10, format: dense},"
       " features: {alias: F, dim: 784, format: dense}}"},
      {"50x20_jagged_sequences_sparse", "{features: {alias: F0, dim: 100, format: sparse}}"}};
  for (const auto& [name, input] : cases) {
    SCOPED_TRACE(name);
    auto ds = Dataset::Open(CtfDataset(TextDir() + name + ".txt", input, "randomize: false"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    const std::string path = dir.Write(name + ".bin", WriteDocumented(**ds));
    ExpectMemberListsAsTheParse(CbfDataset(path, Precision::kFloat));
    ExpectSelfJoinDumpsAsTheFile(path, (*ds)->streams()[0].name);
  }
}

// A chunk the decoder rejects fails the member's open with the decoder's own message (the
// one reading the file alone gives), naming the file and chunk; a chunk it accepts opens.
TEST(CbfMember, ACorruptChunkFailsTheOpenAsTheDecoderWould) {
  TempDir dir;
  auto bytes = MappedFile::Open(BinDir() + "10x10_sparse.bin");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string good((*bytes)->bytes());
  auto file = ReadCbfFile(good, "s.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  DatasetOpenOptions options;
  options.index_threads = 1;  // thousands of opens of a one-chunk file
  int failed = 0;
  for (size_t i = file->chunks[0].offset; i < file->header_offset; ++i) {  // the chunks' bytes
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    const std::string path = dir.Write("s.bin", bad);
    const DatasetConfig alone = CbfDataset(path, Precision::kDouble);
    auto ds = Dataset::Open(alone, options);
    if (!ds.ok()) continue;  // the sequence lengths: the file fails alone too
    std::string first_error;
    for (uint64_t c = 0; c < (*ds)->index().chunks.size() && first_error.empty(); ++c) {
      auto chunk = (*ds)->ParseChunk(c);
      if (!chunk.ok()) first_error = std::string(chunk.status().message());
    }
    DeserializerContext context{alone.deserializers[0], alone, "", nullptr, nullptr, {}, options,
                                /*member=*/true};
    auto member = DeserializerRegistry::Global().Open(context);
    if (first_error.empty()) {
      EXPECT_TRUE(member.ok()) << "byte " << i << ": " << member.status();
      continue;
    }
    ++failed;
    ASSERT_FALSE(member.ok()) << "byte " << i;
    EXPECT_EQ(member.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(member.status().message(), first_error) << "byte " << i;
    EXPECT_NE(first_error.find(path + ": chunk "), std::string::npos) << first_error;
  }
  EXPECT_GT(failed, 100);
  // And through a composite: the open fails, naming the member's file and chunk.
  std::string bad = good;
  const uint32_t too_many = 1000;
  std::memcpy(&bad[12 + 4 * 10], &too_many, 4);  // chunk 0's first sequence's sample count
  const std::string path = dir.Write("s.bin", bad);
  const std::string yaml = absl::StrCat(
      "datasets:\n  d:\n    precision: double\n    deserializers:\n",
      "      - type: CNTKBinary\n        file: ", BinDir(), "50x20_jagged_sequences_dense.bin\n",
      "      - type: CNTKBinary\n        file: ", path, "\n",
      "        input: {s: {alias: features}}\n");
  auto config = LoadConfigFile(dir.Write("c.yaml", yaml));
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(config->datasets[0]);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ds.status().message().find(path + ": chunk 0, byte "), std::string::npos)
      << ds.status();
}

}  // namespace
}  // namespace conveyor::testing
