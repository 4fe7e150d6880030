// The `conveyor` binary end to end: exit codes, one-line errors, the dump and bench formats.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

using CliRun = CommandRun;

CliRun Conveyor(const std::string& args) { return RunCommand(std::string(CONVEYOR_BINARY) + " " + args); }

const std::string kExamples = std::string(CONVEYOR_SOURCE_DIR) + "/examples/conveyor.yaml";

TEST(Cli, DumpPrintsTheExampleInTheDumpFormat) {
  CliRun r = Conveyor("dump " + kExamples + " --dataset simple --minibatch-size 2 --randomize off");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto first = r.out.substr(0, r.out.find('\n'));
  EXPECT_EQ(first, "{\"epoch\":0,\"batch\":0,\"key\":\"0\",\"streams\":{\"features\":{\"dense\":[[1.75919998,-0.758000016]]},\"labels\":{\"dense\":[[0,1]]}}}");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1000);
  EXPECT_NE(r.out.find("\"batch\":499,\"key\":\"999\""), std::string::npos);
}

// convert the sparse example to CBF, read it back as `type: CNTKBinary`: same sequences.
TEST(Cli, ConvertThenDumpTheBinaryFile) {
  TempDir dir;
  const std::string cbf = dir.path() + "/sparse.cbf";
  CliRun conv = Conveyor("convert " + std::string(CONVEYOR_SOURCE_DIR) + "/examples/sparse.ctf " + cbf + " --config " +
                         kExamples + " --dataset sparse --chunk-size 65536");
  ASSERT_EQ(conv.code, 0) << conv.out;
  EXPECT_NE(conv.out.find("2000 sequences, 2000 samples"), std::string::npos) << conv.out;
  const std::string config = dir.Write("cbf.yaml", "datasets:\n  b:\n    randomize: false\n    cacheIndex: true\n"
                                                   "    deserializers:\n      - {type: CNTKBinary, file: " + cbf + "}\n");
  CliRun back = Conveyor("inspect " + config);
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NE(back.out.find("words            alias words    sparse dim 5000     samples 2000  nnz 34921"), std::string::npos)
      << back.out;
  // cacheIndex on a CBF dataset: no cache file, and the command says so rather than naming none.
  CliRun index = Conveyor("index " + config);
  ASSERT_EQ(index.code, 0) << index.out;
  EXPECT_NE(index.out.find("cache: none (cacheIndex applies to a dataset of one CNTKTextFormat file"), std::string::npos)
      << index.out;
  CliRun missing = Conveyor("convert /nonexistent.ctf " + cbf + " --config " + kExamples + " --dataset sparse");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("/nonexistent.ctf"), std::string::npos) << missing.out;
}

TEST(Cli, DumpOfBrainScriptReaderBlockEqualsTheYamlDataset) {
  CliRun bs = Conveyor("dump " + std::string(CONVEYOR_SOURCE_DIR) + "/examples/reader.cntk --minibatch-size 8");
  CliRun yaml = Conveyor("dump " + kExamples + " --dataset simple --minibatch-size 8");
  ASSERT_EQ(bs.code, 0) << bs.out;
  EXPECT_EQ(bs.out, yaml.out);
}

TEST(Cli, DumpIsTheSameForAnyThreadCount) {
  CliRun one = Conveyor("dump " + kExamples + " --dataset sequences --minibatch-size 7 --threads 1");
  CliRun four = Conveyor("dump " + kExamples + " --dataset sequences --minibatch-size 7 --threads 4");
  ASSERT_EQ(one.code, 0);
  EXPECT_EQ(one.out, four.out);
}

// Numbers on the command line are decimal: a leading zero is no octal prefix (CLI11 alone
// read "010" as 8), and leading zeros change nothing.
TEST(Cli, NumbersWithLeadingZerosAreDecimal) {
  CliRun ten = Conveyor("dump " + kExamples + " --dataset simple --minibatch-size 10 --epoch-size 80 --seed 9 --randomize on");
  CliRun zero = Conveyor("dump " + kExamples + " --dataset simple --minibatch-size 010 --epoch-size 0080 --seed 09 --randomize on");
  ASSERT_EQ(ten.code, 0) << ten.out;
  ASSERT_EQ(zero.code, 0) << zero.out;
  EXPECT_EQ(zero.out, ten.out);
  EXPECT_NE(ten.out.find("\"batch\":7,"), std::string::npos);  // 8 batches of 10
  EXPECT_EQ(ten.out.find("\"batch\":8,"), std::string::npos);
  CliRun rank = Conveyor("dump " + kExamples + " --dataset simple --world 010 --rank 9 --epoch-size 20");
  EXPECT_EQ(rank.code, 0) << rank.out;
}

// --assembler cuda: identical output whichever assembler serves; without a usable device one
// line says the CPU serves and why.
TEST(Cli, DumpThroughTheCudaAssemblerEqualsTheCpuOne) {
  for (const char* dataset : {"sequences", "sparse"}) {
    const std::string base = "dump " + kExamples + " --dataset " + dataset + " --minibatch-size 9 --epochs 1";
    CliRun cpu = Conveyor(base);
    CliRun cuda = Conveyor(base + " --assembler cuda");
    ASSERT_EQ(cpu.code, 0) << cpu.out.substr(0, 300);
    ASSERT_EQ(cuda.code, 0) << cuda.out.substr(0, 300);
    const std::string note = cuda.out.substr(0, cuda.out.find('\n') + 1);
    EXPECT_EQ(note.rfind("conveyor: assembler: ", 0), 0u) << note;
    EXPECT_TRUE(cpu.out == cuda.out.substr(note.size())) << dataset;
  }
  CliRun note = Conveyor("dump " + kExamples + " --dataset simple --assembler cuda --epochs 1");
  ASSERT_EQ(note.code, 0);
  const bool on_gpu = note.out.find("conveyor: assembler: cuda device 0") != std::string::npos;
  const bool fell_back = note.out.find("conveyor: assembler: cpu (") != std::string::npos;
  EXPECT_TRUE(on_gpu || fell_back) << note.out.substr(0, 300);
  CliRun bad = Conveyor("dump " + kExamples + " --dataset simple --assembler tpu");
  EXPECT_NE(bad.code, 0);
}

TEST(Cli, UnknownDatasetIsOneLineWithTheChoices) {
  CliRun r = Conveyor("dump " + kExamples + " --dataset nope");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("has no dataset 'nope' (it defines: simple, sparse, sequences)"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
}

TEST(Cli, MissingConfigSaysSo) {
  CliRun r = Conveyor("inspect /nonexistent/c.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/c.yaml: cannot open configuration"), std::string::npos) << r.out;
}

TEST(Cli, RandomizedDumpResumesFromAnyCursor) {
  // Every batch's last line carries a cursor; resuming from it prints exactly the rest.
  const std::string args = "dump " + kExamples + " --dataset sparse --randomize on --seed 5 --minibatch-size 300 --epochs 2";
  CliRun full = Conveyor(args);
  ASSERT_EQ(full.code, 0) << full.out;
  std::vector<std::string> lines;
  for (size_t p = 0, q; (q = full.out.find('\n', p)) != std::string::npos; p = q + 1) lines.push_back(full.out.substr(p, q - p));
  ASSERT_EQ(lines.size(), 4000u);
  size_t resumed = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t at = lines[i].find("\"cursor\":\"");
    if (at == std::string::npos) continue;
    if (++resumed % 3 != 0) continue;  // every third batch boundary keeps the test quick
    const std::string token = lines[i].substr(at + 10, lines[i].find('"', at + 10) - at - 10);
    CliRun rest = Conveyor(args + " --resume " + token);
    ASSERT_EQ(rest.code, 0) << rest.out;
    std::string expected;
    for (size_t j = i + 1; j < lines.size(); ++j) expected += lines[j] + "\n";
    ASSERT_EQ(rest.out, expected) << "resuming after line " << i;
  }
  EXPECT_GT(resumed, 10u);
}

TEST(Cli, ResumeRefusesAForeignOrCorruptCursor) {
  CliRun one = Conveyor("dump " + kExamples + " --dataset simple --randomize on --minibatch-size 100");
  const size_t at = one.out.find("\"cursor\":\"");
  ASSERT_NE(at, std::string::npos);
  const std::string token = one.out.substr(at + 10, one.out.find('"', at + 10) - at - 10);
  CliRun other_dataset = Conveyor("dump " + kExamples + " --dataset sparse --randomize on --minibatch-size 100 --resume " + token);
  EXPECT_EQ(other_dataset.code, 1);
  EXPECT_NE(other_dataset.out.find("cursor was made for another dataset"), std::string::npos) << other_dataset.out;
  // One option changed: the message names it, with the value the cursor was made with.
  const std::string simple = "dump " + kExamples + " --dataset simple ";
  for (const auto& [options, says] : std::vector<std::pair<std::string, std::string>>{
           {"--randomize on --minibatch-size 99", "cursor was made with minibatch size 100 (this request: 99)"},
           {"--randomize off --minibatch-size 100", "cursor was made with randomization on (this request: off)"},
           {"--randomize on --minibatch-size 100 --frame-mode", "cursor was made with frame mode off (this request: on)"},
           {"--randomize on --minibatch-size 100 --minibatch-mode full",
            "cursor was made with minibatch mode partial (this request: full)"},
           {"--randomize on --minibatch-size 100 --epoch-size 700",
            "cursor was made with epoch size one sweep (no epoch size) (this request: 700 samples)"},
           {"--randomize on --minibatch-size 100 --seed 99", "not 99: resume with the seed that produced it"},
           // Two options changed: no single one explains it.
           {"--randomize off --minibatch-size 99", "cursor was made with another configuration (minibatch size,"},
       }) {
    CliRun other_config = Conveyor(simple + options + " --resume " + token);
    EXPECT_EQ(other_config.code, 1) << options;
    EXPECT_NE(other_config.out.find(says), std::string::npos) << options << ": " << other_config.out;
  }
  // A value only the configuration sets (the window): named as the configuration's.
  TempDir dir;
  auto window = [&](int chunks) {
    return dir.Write("w" + std::to_string(chunks) + ".yaml",
                     "datasets:\n  s:\n    randomizationWindow: " + std::to_string(chunks) + "\n    deserializers: [{file: " +
                         std::string(CONVEYOR_SOURCE_DIR) + "/examples/simple.ctf, chunkSizeInBytes: 4096, input: "
                         "{features: {dim: 2, format: dense}, labels: {dim: 2, format: dense}}}]\n");
  };
  CliRun four = Conveyor("dump " + window(4) + " --randomize on --minibatch-size 100");
  const size_t w4 = four.out.find("\"cursor\":\"");
  ASSERT_NE(w4, std::string::npos) << four.out;
  const std::string token4 = four.out.substr(w4 + 10, four.out.find('"', w4 + 10) - w4 - 10);
  CliRun eight = Conveyor("dump " + window(8) + " --randomize on --minibatch-size 100 --resume " + token4);
  EXPECT_EQ(eight.code, 1) << eight.out;
  EXPECT_NE(eight.out.find("cursor was made with randomization window 4 chunks (now 8 chunks, from the dataset's "
                           "configuration): resume with the options and configuration that produced it"),
            std::string::npos)
      << eight.out;
  std::string corrupt = token;
  corrupt[corrupt.size() / 2] = corrupt[corrupt.size() / 2] == 'A' ? 'B' : 'A';
  CliRun bad = Conveyor("dump " + kExamples + " --dataset simple --randomize on --minibatch-size 100 --resume " + corrupt);
  EXPECT_NE(bad.out.find("cursor is not valid"), std::string::npos) << bad.out;
}

TEST(Cli, BadDataIsFileLineColumn) {
  TempDir dir;
  dir.Write("d.ctf", "|a 1\n|a 2;\n");
  const std::string c = dir.Write("c.yaml", "datasets:\n  d:\n    randomize: false\n    deserializers: [{file: d.ctf, input: {a: {dim: 1, format: dense}}}]\n");
  CliRun r = Conveyor("dump " + c);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("d.ctf:2:5: unexpected ';' in a number for input 'a'"), std::string::npos) << r.out;
}

// Bad lines in chunks parsed at the same time (maxErrors 0, two threads): whichever parse
// refuses first, the error the read stops at is "more than maxErrors", never one "exceeded
// earlier" (that is for a later read of a dataset whose budget an earlier read broke).
TEST(Cli, BadDataInChunksParsedTogetherIsNotBlamedOnTheOther) {
  TempDir dir;
  std::string ctf;
  for (int i = 0; i < 6000; ++i) ctf += (i == 1700 || i == 1850) ? "|a 1 x\n" : "|a " + std::to_string(i) + " 0.25\n";
  dir.Write("d.ctf", ctf);  // lines 1700 and 1850 start at bytes 21010 and 22960: the chunks either side of 22000
  const std::string c = dir.Write("c.yaml", "datasets:\n  d:\n    randomize: false\n    deserializers: [{file: d.ctf, "
                                            "chunkSizeInBytes: 22000, input: {a: {dim: 2, format: dense}}}]\n");
  for (int run = 0; run < 4; ++run) {
    CliRun r = Conveyor("dump " + c + " --threads 2 --minibatch-size 5000");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("(more than maxErrors=0 input errors"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("exceeded earlier"), std::string::npos) << r.out;
  }
}

TEST(Cli, BenchJsonEndsWithTheSummaryLine) {
  CliRun r = Conveyor("bench " + kExamples + " --dataset sparse --threads 2 --epochs 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::string last = r.out.substr(0, r.out.size() - 1);
  last = last.substr(last.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("{\"bytes\": 784980, \"seconds\": ", 0), 0u) << last;
  EXPECT_NE(last.find("\"samples\": 6000, \"batches\": "), std::string::npos) << last;
  // The start and the rate after it, apart: several batches, so a rate after the first.
  const size_t first = last.find("\"first_batch_ms\": "), steady = last.find("\"steady_mbs\": ");
  ASSERT_NE(first, std::string::npos) << last;
  ASSERT_NE(steady, std::string::npos) << last;
  EXPECT_GT(std::stod(last.substr(first + 18)), 0.0) << last;
  EXPECT_GT(std::stod(last.substr(steady + 14)), 0.0) << last;
  // CPU: the process's, and the loader's thread's share of it (this thread planned every batch).
  const size_t cpu = last.find("\"cpu_seconds\": "), loader = last.find("\"loader_cpu_seconds\": ");
  ASSERT_NE(cpu, std::string::npos) << last;
  ASSERT_NE(loader, std::string::npos) << last;
  const double process_cpu = std::stod(last.substr(cpu + 15)), loader_cpu = std::stod(last.substr(loader + 22));
  EXPECT_GT(loader_cpu, 0.0) << last;
  EXPECT_LE(loader_cpu, process_cpu + 2e-6) << last;  // (each printed to the microsecond)
}

// The input counted is the files' share the samples read are: 2 epochs of 1000 samples of
// this 2000-sample file are one file's bytes (784980 / 3 above), not two; rank 0 of 2 reads
// half of 3 sweeps.
TEST(Cli, BenchCountsTheInputItsSamplesAre) {
  CliRun r = Conveyor("bench " + kExamples + " --dataset sparse --epoch-size 1000 --epochs 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("{\"bytes\": 261660, \"seconds\": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"samples\": 2000, "), std::string::npos) << r.out;
  r = Conveyor("bench " + kExamples + " --dataset sparse --epochs 3 --rank 0 --world 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("{\"bytes\": 392490, \"seconds\": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"samples\": 3000, "), std::string::npos) << r.out;
}

TEST(Cli, IndexWritesAndReusesTheCache) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 100; ++i) data += std::to_string(i) + " |a 1\n";
  dir.Write("d.ctf", data);
  const std::string c = dir.Write("c.yaml", "datasets:\n  d:\n    cacheIndex: true\n    deserializers: [{file: d.ctf, input: {a: {dim: 1, format: dense}}}]\n");
  CliRun first = Conveyor("index " + c);
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("100 sequences, 100 samples, 1 chunks; index built"), std::string::npos) << first.out;
  CliRun second = Conveyor("index " + c);
  EXPECT_NE(second.out.find("index loaded from cache"), std::string::npos) << second.out;
}

TEST(Cli, InspectCountsErrorsWithoutStopping) {
  TempDir dir;
  dir.Write("d.ctf", "1 |a 1\n2 |a x\n3 |a 3\n");
  const std::string c = dir.Write("c.yaml", "datasets:\n  d:\n    deserializers: [{file: d.ctf, input: {a: {dim: 1, format: dense}}}]\n");
  CliRun r = Conveyor("inspect " + c + " --json");
  ASSERT_EQ(r.code, 1) << r.out;  // it found an input error: the status says so
  EXPECT_NE(r.out.find("\"sequences\":3,\"valid_sequences\":2,\"samples\":3,\"errors\":1,\"max_errors\":0"), std::string::npos) << r.out;
}

TEST(Cli, HelpTeachesEveryCommand) {
  for (const char* cmd : {"inspect", "index", "dump", "bench"}) {
    CliRun r = Conveyor(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("Options:"), std::string::npos) << cmd;
  }
}

}  // namespace
}  // namespace conveyor::testing
