// CTF hot paths on one core, each next to references measured in the same run: a memchr
// newline scan of the same buffer (memory-bound) and a naive strtof loop over it (the
// number conversion a plain parser pays). Read the figures as ratios (parse MB/s over
// reference MB/s). Run: build/bench/ctf_bench  (see bench/RESULTS.md)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>

#include "bench/ctf_generator.h"
#include "common/error_budget.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/formats/ctf/ctf_parser.h"
#include "common/log.h"
#include "common/malloc_tuning.h"

namespace conveyor::bench {
namespace {

constexpr uint64_t kBytes = 32u << 20;

const std::string& Dense() {
  static const std::string s = DenseCtf(kBytes);
  return s;
}
const std::string& Sparse() {
  static const std::string s = SparseCtf(kBytes);
  return s;
}

void MemchrScan(benchmark::State& state, const std::string& data) {
  for (auto _ : state) {
    uint64_t lines = 0;
    const char* p = data.data();
    const char* end = p + data.size();
    while (const void* q = std::memchr(p, '\n', end - p)) {
      ++lines;
      p = static_cast<const char*>(q) + 1;
    }
    benchmark::DoNotOptimize(lines);
  }
  state.SetBytesProcessed(state.iterations() * data.size());
}
void BM_MemchrScan_Dense(benchmark::State& s) { MemchrScan(s, Dense()); }
void BM_MemchrScan_Sparse(benchmark::State& s) { MemchrScan(s, Sparse()); }

// Walks the buffer calling strtof at every number (a digit, sign or '.'), skipping any
// other byte: the same bytes through libc's conversion, nothing stored. The buffer is a
// std::string, so strtof stops at its terminating NUL at the latest.
void StrtofLoop(benchmark::State& state, const std::string& data) {
  for (auto _ : state) {
    float sum = 0;
    const char* p = data.c_str();
    const char* const end = p + data.size();
    while (p < end) {
      const char c = *p;
      if ((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.') {
        char* next;
        sum += std::strtof(p, &next);
        p = next > p ? next : p + 1;
      } else {
        ++p;
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * data.size());
}
void BM_StrtofLoop_Dense(benchmark::State& s) { StrtofLoop(s, Dense()); }
void BM_StrtofLoop_Sparse(benchmark::State& s) { StrtofLoop(s, Sparse()); }

void Parse(benchmark::State& state, const std::string& data, std::vector<StreamConfig> streams) {
  CtfIndexOptions io;
  io.chunk_size = UINT64_MAX;
  io.threads = 1;
  auto index = BuildCtfIndex(data, "bench.ctf", io);
  if (!index.ok()) {
    state.SkipWithError("index failed");
    return;
  }
  CtfParserOptions po;
  po.path = "bench.ctf";
  po.streams = std::move(streams);
  Diagnostics diagnostics(0, [](Severity, const std::string&) {});
  ErrorBudget budget(0);
  CtfParser parser(po, &diagnostics, &budget);
  uint64_t samples = 0;
  for (auto _ : state) {
    auto chunk = parser.ParseChunk(data, *index, 0);
    if (!chunk.ok()) {
      state.SkipWithError("parse failed");
      return;
    }
    samples += (*chunk)->num_sequences();
    benchmark::DoNotOptimize(chunk);
  }
  state.SetBytesProcessed(state.iterations() * data.size());
  state.SetItemsProcessed(samples);
}
void BM_Parse_Dense100(benchmark::State& s) {
  Parse(s, Dense(), {{"x", "x", StreamFormat::kDense, 100, false}, {"y", "y", StreamFormat::kDense, 1, false}});
}
void BM_Parse_SparseDssm(benchmark::State& s) {
  Parse(s, Sparse(), {{"q", "q", StreamFormat::kSparse, 50000, false}, {"d", "d", StreamFormat::kSparse, 50000, false}});
}

void BM_Index(benchmark::State& state) {
  const std::string& data = Dense();
  CtfIndexOptions io;
  io.threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto index = BuildCtfIndex(data, "bench.ctf", io);
    benchmark::DoNotOptimize(index);
  }
  state.SetBytesProcessed(state.iterations() * data.size());
}

BENCHMARK(BM_MemchrScan_Dense)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StrtofLoop_Dense)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parse_Dense100)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemchrScan_Sparse)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StrtofLoop_Sparse)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parse_SparseDssm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Index)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace conveyor::bench

// The production allocator settings (conveyor and conveyord set them too).
int main(int argc, char** argv) {
  conveyor::TuneAllocatorForStreaming();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
