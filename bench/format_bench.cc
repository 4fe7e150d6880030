// Decoders on one core, per format, next to a memcpy of the same input bytes: what a
// parser thread can deliver before the loader's own costs. Kaldi archives from
// tests/data/kaldi (the same ones Kaldi's single-core rates in bench/RESULTS.md were measured on):
// FM (plain floats), CM (1 byte a value, per-column percentiles), CM2 (uint16), CM3 (uint8).
//   build/bench/format_bench [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
// Throughput is MB/s of archive bytes (counters "bytes_per_second").
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_table.h"

namespace conveyor {
namespace {

std::string TestdataDir() {
  const char* env = std::getenv("CONVEYOR_TESTDATA");
  return env != nullptr ? env : CONVEYOR_TESTDATA_DIR;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The archive repeated to about 16 MB, so that one pass is not a cache-resident toy.
std::string Archive(const std::string& name) {
  const std::string one = Slurp(TestdataDir() + "/kaldi/" + name);
  if (one.empty()) return one;
  std::string out;
  while (out.size() < (16u << 20)) out += one;
  return out;
}

void BM_Memcpy(benchmark::State& state) {
  const std::string in = Archive("cm_speech.ark");
  std::vector<char> out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_Memcpy);

void BM_KaldiDecode(benchmark::State& state, const std::string& name) {
  std::string bytes = Archive(name);
  if (bytes.empty()) {
    state.SkipWithError(("no " + name + " under " + TestdataDir() + "/kaldi").c_str());
    return;
  }
  const uint64_t size = bytes.size();
  kaldi::TableOptions o;
  auto table = kaldi::KaldiTable::OpenArchiveBytes(std::move(bytes), name, o);
  if (!table.ok()) {
    state.SkipWithError(std::string(table.status().message()).c_str());
    return;
  }
  uint64_t most = 0;
  for (const auto& e : (*table)->entries()) most = std::max<uint64_t>(most, e.window.rows * e.window.cols);
  std::vector<float> out(most);
  for (auto _ : state) {
    for (size_t i = 0; i < (*table)->entries().size(); ++i) {
      (*table)->Decode<float>(i, out.data());
      benchmark::DoNotOptimize(out.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}
BENCHMARK_CAPTURE(BM_KaldiDecode, FM, std::string("feats.ark"));
BENCHMARK_CAPTURE(BM_KaldiDecode, CM, std::string("cm_speech.ark"));
BENCHMARK_CAPTURE(BM_KaldiDecode, CM2, std::string("cm_2byte_auto.ark"));
BENCHMARK_CAPTURE(BM_KaldiDecode, CM3, std::string("cm_1byte_auto.ark"));

}  // namespace
}  // namespace conveyor

BENCHMARK_MAIN();
