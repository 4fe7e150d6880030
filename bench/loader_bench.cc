// What one subscription's loader thread costs per sequence once chunks are parsed: planning
// (planner, Loader::Begin, PlanBatch) and CPU assembly, with every chunk kept in memory
// (keepDataInMemory) so that no epoch after the first parses, and assembly on the calling
// thread alone (no helpers) or helped by the idle pool thread, and planning alone or helped
// too (the second arg). An iteration is one epoch of minibatches of 4096 samples;
// sequences_per_second is the rate the loader's thread would sustain if nothing else bound
// it. Reference: BM_MemcpyBatchBytes copies the same number of batch bytes per epoch.
// On a shared 2-core VM the rate swings 1.5x between runs; instructions do not: run it under
// callgrind with collection on the timed epochs only, and smaller files:
//   LOADER_BENCH_MB=8 valgrind --tool=callgrind --collect-atstart=no
//     --toggle-collect='*TimedEpoch*' build/bench/loader_bench --benchmark_filter=CbfSparse/0/0
//     --benchmark_min_time=0
// and divide the instructions by the sequences (printed on stderr).
//
// Datasets (written to a temporary directory at start): 64 MB of sparse DSSM-like CTF (two
// 50000-dim streams of ~15 entries, one sample a sequence), the same converted to CBF (values
// used in place from the mapping), and 64 MB of dense CTF (100 floats + 1).
// Run: build/bench/loader_bench [--benchmark_filter=...]. Environment: LOADER_BENCH_MB (file
// size, default 64), LOADER_BENCH_MINIBATCH (samples, default 4096), LOADER_BENCH_WINDOW
// (randomization window in chunks, default every chunk).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/ctf_generator.h"
#include "common/batch/assembler.h"
#include "common/config/config_loader.h"
#include "common/convert/cbf_writer.h"
#include "common/dataset/dataset.h"
#include "common/huge_pages.h"
#include "common/sampling/loader.h"

namespace conveyor::bench {
namespace {

struct Files {
  std::string dir, sparse_ctf, dense_ctf, sparse_cbf;
};

// One dataset of `file`: `body` is its YAML after the file (e.g. the CTF inputs).
DatasetConfig Config(const std::string& type, const std::string& file, const std::string& body) {
  const std::string yaml = "datasets:\n  d:\n    randomize: false\n    keepDataInMemory: true\n"
                           "    deserializers:\n      - type: " + type + "\n        file: " + file + "\n" + body;
  auto config = ParseConfig(yaml, "loader_bench.yaml", "");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    std::abort();
  }
  return config->datasets[0];
}

DatasetConfig CtfConfig(const std::string& file, bool sparse) {
  return Config("CNTKTextFormat", file,
                sparse ? "        input: {q: {dim: 50000, format: sparse}, d: {dim: 50000, format: sparse}}\n"
                       : "        input: {x: {dim: 100, format: dense}, y: {dim: 1, format: dense}}\n");
}

DatasetConfig CbfConfig(const std::string& file) { return Config("CNTKBinary", file, ""); }

const Files& TheFiles() {
  static const Files f = [] {
    Files out;
    char tmpl[] = "/tmp/conveyor-loader-bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    out.dir = tmpl;
    out.sparse_ctf = out.dir + "/sparse.ctf";
    out.dense_ctf = out.dir + "/dense.ctf";
    out.sparse_cbf = out.dir + "/sparse.cbf";
    const char* mb = std::getenv("LOADER_BENCH_MB");
    const uint64_t bytes = (mb != nullptr ? std::strtoull(mb, nullptr, 10) : 64) << 20;
    std::ofstream(out.sparse_ctf) << SparseCtf(bytes);
    std::ofstream(out.dense_ctf) << DenseCtf(bytes);
    auto ds = Dataset::Open(CtfConfig(out.sparse_ctf, true));
    if (!ds.ok()) {
      std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
      std::abort();
    }
    CbfWriteOptions wo;
    wo.chunk_size = 8u << 20;
    if (!WriteCbf(**ds, out.sparse_cbf, wo).ok()) std::abort();
    std::atexit([] {
      const Files& files = TheFiles();
      for (const std::string& p : {files.sparse_ctf, files.dense_ctf, files.sparse_cbf}) std::remove(p.c_str());
      rmdir(files.dir.c_str());
    });
    return out;
  }();
  return f;
}

// Reads one epoch from `loader`: the batches after the last one read, up to and including the
// next that ends an epoch. False at the end or on an error. Not inlined: the callgrind recipe
// above collects inside it. (Until 2026-11-30 it stopped at the first batch of another epoch
// than *b's, so that every other call read one batch: the per-epoch times and per-sequence
// rates it gave were for half an epoch, 2x optimistic; bytes_per_second was right.)
__attribute__((noinline)) bool TimedEpoch(Loader* loader, Batch* b, uint64_t* bytes) {
  do {
    auto more = loader->Next(b);
    if (!more.ok() || !*more) return false;
    *bytes += b->bytes.size();
  } while (!b->end_of_epoch);
  return true;
}

// One epoch a iteration; first arg 0: file order, 1: randomized (window of every chunk);
// second arg 0: the loader's thread alone; 1: the pool's thread (idle once every chunk is
// kept) helps assemble, as in the daemon; 2: it also places ranges of each batch's pieces
// (PlanThreads).
void LoaderEpochs(benchmark::State& state, const DatasetConfig& config) {
  auto ds = Dataset::Open(config);
  if (!ds.ok()) {
    state.SkipWithError(std::string(ds.status().message()).c_str());
    return;
  }
  CpuAssemblerOptions ao;
  if (state.range(1) == 0) ao.min_parallel_bytes = UINT64_MAX;  // the calling thread alone
  auto assembler = MakeCpuAssembler(ao);
  LoaderOptions lo;
  const char* mb_size = std::getenv("LOADER_BENCH_MINIBATCH");  // (default 4096)
  lo.planner.minibatch_size = mb_size != nullptr ? std::strtoull(mb_size, nullptr, 10) : 4096;
  lo.planner.epochs = UINT32_MAX;
  lo.planner.randomizer.randomize = state.range(0) != 0;
  lo.planner.randomizer.seed = 1;
  const char* window = std::getenv("LOADER_BENCH_WINDOW");  // chunks (default: all of them)
  lo.planner.randomizer.window = window != nullptr ? std::strtoull(window, nullptr, 10) : (*ds)->index().chunks.size();
  lo.threads = 1;
  if (state.range(1) < 2) lo.min_plan_range_pieces = SIZE_MAX;  // planned alone
  auto loader = Loader::Create(ds->get(), assembler.get(), lo);
  if (!loader.ok()) {
    state.SkipWithError(std::string(loader.status().message()).c_str());
    return;
  }
  Batch b;
  uint64_t bytes = 0;
  // The first epoch waits for the parses (on the pool thread); its planning and assembly are
  // as any epoch's, and callgrind counts them too (hence "+ 1" below).
  if (!TimedEpoch(loader->get(), &b, &bytes)) {
    state.SkipWithError("the first epoch failed");
    return;
  }
  bytes = 0;
  for (auto _ : state) {
    if (!TimedEpoch(loader->get(), &b, &bytes)) {
      state.SkipWithError("an epoch failed");
      return;
    }
  }
  const uint64_t sequences = (*ds)->index().sequences.size();
  std::fprintf(stderr, "%llu sequences an epoch, %llu timed epochs + 1\n",
               static_cast<unsigned long long>(sequences), static_cast<unsigned long long>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["sequences_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations() * sequences), benchmark::Counter::kIsRate);
}

void BM_LoaderCtfSparse(benchmark::State& s) { LoaderEpochs(s, CtfConfig(TheFiles().sparse_ctf, true)); }
void BM_LoaderCbfSparse(benchmark::State& s) { LoaderEpochs(s, CbfConfig(TheFiles().sparse_cbf)); }
void BM_LoaderCtfDense(benchmark::State& s) { LoaderEpochs(s, CtfConfig(TheFiles().dense_ctf, false)); }

// The reference: copying one epoch's batch bytes of the sparse CBF read (measured once)
// between two buffers of 1.6 MB, the size of its batches.
void BM_MemcpyBatchBytes(benchmark::State& state) {
  const size_t batch = 1600000;
  std::vector<char> a(batch, 1), c(batch);
  uint64_t bytes = 0;
  for (auto _ : state) {
    for (int i = 0; i < 100; ++i) {
      std::memcpy(c.data(), a.data(), batch);
      benchmark::DoNotOptimize(c.data());
    }
    bytes += 100 * batch;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

// What a randomized dense read's row gather can cost on this machine, apart from the loader:
// 404-byte rows (CTF dense 100 + 1) lying in a window of 8 parsed 32 MiB chunks' worth of
// rows (113 MB, 2 MiB pages as parsed chunks get them), copied 256 at a time into one batch,
// in file order (arg 0 = 0: the reference, the same bytes) or a random order (1), with
// every line of each row prefetched arg 1 rows ahead (0: none, as the hardware alone does).
// bench/RESULTS.md (2026-11-30): random 80-88 ns a row whatever the prefetch, file order
// 26-28: the randomized gather costs what this memory costs, not what the loader adds.
void BM_RowGather(benchmark::State& state) {
  constexpr size_t kRow = 404, kRows = 8 * 35000, kBatch = 256;
  const bool random = state.range(0) != 0;
  const size_t ahead = static_cast<size_t>(state.range(1));
  HugeVector<std::byte> rows(kRow * kRows);
  std::memset(rows.data(), 1, rows.size());
  std::vector<uint32_t> order(kRows);
  for (size_t i = 0; i < kRows; ++i) order[i] = static_cast<uint32_t>(i);
  if (random) {
    std::mt19937 rng(1);
    std::shuffle(order.begin(), order.end(), rng);
  }
  std::vector<std::byte> batch(kBatch * kRow);
  auto prefetch = [&](size_t i) {
    const std::byte* p = rows.data() + size_t{order[i]} * kRow;
    for (size_t at = 0; at < kRow; at += 64) __builtin_prefetch(p + at);
    __builtin_prefetch(p + kRow - 1);
  };
  for (auto _ : state) {
    for (size_t b = 0; b < kRows; b += kBatch) {
      const size_t n = std::min(kBatch, kRows - b);
      for (size_t i = 0; ahead > 0 && i < std::min(n, ahead); ++i) prefetch(b + i);
      for (size_t i = 0; i < n; ++i) {
        if (ahead > 0 && i + ahead < n) prefetch(b + i + ahead);
        std::memcpy(batch.data() + i * kRow, rows.data() + size_t{order[b + i]} * kRow, kRow);
      }
      benchmark::DoNotOptimize(batch.data());
      benchmark::ClobberMemory();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRows * kRow));
  state.counters["ns_per_row"] = benchmark::Counter(static_cast<double>(state.iterations() * kRows),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_LoaderCtfSparse)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderCbfSparse)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoaderCtfDense)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyBatchBytes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RowGather)->ArgsProduct({{0, 1}, {0, 8, 32}})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::bench

BENCHMARK_MAIN();
