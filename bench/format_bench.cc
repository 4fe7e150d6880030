// Decoders on one core, per format, next to a memcpy of the same input bytes: what a
// parser thread can deliver before the loader's own costs. Kaldi archives from
// tests/data/kaldi (the same ones Kaldi's single-core rates in bench/RESULTS.md were measured on):
// FM (plain floats), CM (1 byte a value, per-column percentiles), CM2 (uint16), CM3 (uint8).
// CBF: ctf2bin's layout, made here in memory in the shape of `gen_ctf sparse` converted (two
// sparse float streams of dim 50000, 15 entries a one-sample sequence), 64 MiB in 8 MiB chunks
// (past the last-level cache, as a file read from the page cache is): ParseCbfChunk of every
// chunk, which checks every count and index and leaves the entries where they lie; and that
// index check alone by variant (scalar, SSE2, AVX2), over one chunk held in cache. HTK frames,
// with and without a context window, decoded into the chunk and copied, or at assembly.
//   build/bench/format_bench [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
// Throughput is MB/s of archive bytes (counters "bytes_per_second").
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/formats/cbf/cbf_layout.h"
#include "common/formats/cbf/cbf_reader.h"
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

template <typename V>
void Put(std::string* out, V v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(V));
}

// A CBF file in ctf2bin's layout (cbf_reader.h): about `size` bytes of one-sample sequences
// of two sparse float streams, dim 50000, 15 entries each, in chunks of about `chunk` bytes.
std::string SparseCbf(uint64_t size, uint64_t chunk) {
  constexpr uint32_t kDim = 50000, kNnz = 15;
  constexpr uint64_t kSequenceBytes = 4 + 2 * (8 + kNnz * 8 + 4);
  std::string out;
  Put<uint64_t>(&out, kCbfMagic);
  Put<uint32_t>(&out, 1);
  std::vector<std::pair<int64_t, uint32_t>> chunks;  // offset, sequences
  uint64_t rng = 88172645463325252ull;
  auto next = [&rng] { return rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; };
  while (out.size() + chunk <= size) {
    const uint32_t n = static_cast<uint32_t>(chunk / kSequenceBytes);
    chunks.emplace_back(static_cast<int64_t>(out.size()), n);
    for (uint32_t j = 0; j < n; ++j) Put<uint32_t>(&out, 1);
    for (int s = 0; s < 2; ++s) {
      for (uint32_t j = 0; j < n; ++j) {
        Put<uint32_t>(&out, 1);
        Put<int32_t>(&out, kNnz);
        for (uint32_t k = 0; k < kNnz; ++k) Put<float>(&out, static_cast<float>(next() % 1000) / 7);
        for (uint32_t k = 0; k < kNnz; ++k) Put<int32_t>(&out, static_cast<int32_t>(next() % kDim));
        Put<int32_t>(&out, kNnz);
      }
    }
  }
  const int64_t header = static_cast<int64_t>(out.size());
  Put<uint64_t>(&out, kCbfMagic);
  Put<uint32_t>(&out, static_cast<uint32_t>(chunks.size()));
  Put<uint32_t>(&out, 2);
  for (const char* name : {"q", "d"}) {
    Put<uint8_t>(&out, 1);  // sparse
    Put<uint32_t>(&out, 1);
    out += name;
    Put<uint8_t>(&out, 0);  // float
    Put<uint32_t>(&out, kDim);
  }
  for (const auto& [offset, n] : chunks) {
    Put<int64_t>(&out, offset);
    Put<uint32_t>(&out, n);
    Put<uint32_t>(&out, n);
  }
  Put<int64_t>(&out, header);
  return out;
}

void BM_CbfSparseParse(benchmark::State& state) {
  const std::string bytes = SparseCbf(64u << 20, 8u << 20);
  auto file = ReadCbfFile(bytes, "bench.cbf");
  auto index = file.ok() ? BuildCbfIndex(*file, bytes, "bench.cbf") : file.status();
  if (!index.ok()) {
    state.SkipWithError(std::string(index.status().message()).c_str());
    return;
  }
  const std::vector<int> source = {0, 1};
  for (auto _ : state) {
    for (uint64_t c = 0; c < file->chunks.size(); ++c) {
      auto chunk = ParseCbfChunk(bytes, *file, *index, c, source, Precision::kFloat, "bench.cbf");
      if (!chunk.ok()) {
        state.SkipWithError(std::string(chunk.status().message()).c_str());
        return;
      }
      benchmark::DoNotOptimize(chunk->get());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
  state.counters["sequences_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations() * index->sequences.size()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CbfSparseParse)->Unit(benchmark::kMillisecond);

// The index check of the CBF decoders (cbf::IndicesBelow, every sparse entry of a chunk) by
// variant, over one chunk's worth of entries as the decoder meets them: runs of `nnz`
// indices between the values, 8 MiB in all, read again each pass (a chunk just read lies in
// the last-level cache). Bytes are the indices checked.
void BM_CbfIndexCheck(benchmark::State& state, bool (*check)(const char*, uint64_t, uint32_t), uint64_t nnz) {
  const uint64_t stride = 8 * nnz + 12;  // values, indices, a count and the sequence's header
  std::vector<char> chunk(8u << 20);
  uint64_t rng = 88172645463325252ull;
  for (size_t i = 0; i + 4 <= chunk.size(); i += 4) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const uint32_t index = static_cast<uint32_t>(rng % 50000);
    std::memcpy(&chunk[i], &index, 4);
  }
  const uint64_t runs = chunk.size() / stride;
  for (auto _ : state) {
    benchmark::DoNotOptimize(chunk.data());  // read again each pass, not hoisted out of the loop
    benchmark::ClobberMemory();
    bool all = true;
    for (uint64_t j = 0; j < runs; ++j) all &= check(chunk.data() + j * stride + 4 * nnz, nnz, 50000);
    benchmark::DoNotOptimize(all);
    if (!all) {
      state.SkipWithError("an index out of range");
      return;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * runs * nnz * 4));
}
BENCHMARK_CAPTURE(BM_CbfIndexCheck, scalar_15, cbf::detail::IndicesBelowScalar, 15);
BENCHMARK_CAPTURE(BM_CbfIndexCheck, dispatch_15, cbf::IndicesBelow, 15);
BENCHMARK_CAPTURE(BM_CbfIndexCheck, dispatch_33, cbf::IndicesBelow, 33);
#if defined(__SSE2__)
BENCHMARK_CAPTURE(BM_CbfIndexCheck, sse2_15, cbf::detail::IndicesBelowSse2, 15);
BENCHMARK_CAPTURE(BM_CbfIndexCheck, sse2_33, cbf::detail::IndicesBelowSse2, 33);
#endif
#if defined(CONVEYOR_CBF_AVX2)
// (AVX2 alone runs only where the processor has it; the dispatch picks it there.)
void BM_CbfIndexCheckAvx2(benchmark::State& state, uint64_t nnz) {
  if (!__builtin_cpu_supports("avx2")) {
    state.SkipWithError("this processor has no AVX2");
    return;
  }
  BM_CbfIndexCheck(state, cbf::detail::IndicesBelowAvx2, nnz);
}
BENCHMARK_CAPTURE(BM_CbfIndexCheckAvx2, avx2_15, 15);
BENCHMARK_CAPTURE(BM_CbfIndexCheckAvx2, avx2_33, 33);
#endif

// HTK: 1600 utterances of 300 big-endian frames of 33 values (63 MB) in one archive, read as a
// dataset, every utterance written into a rotating 32 MiB batch buffer (past the caches, as a
// batch is): decoded into the parsed chunk and then copied out (frameMode datasets, and every
// read before 2026-12-07), or left in the file and decoded by the assembler's codec straight
// into the buffer (the daemon's and the CLI's reads); without a window and with 11 frames.
class HtkArchive {
 public:
  HtkArchive() {
    char dir[] = "/tmp/conveyor-format-bench.XXXXXX";
    if (mkdtemp(dir) == nullptr) return;
    dir_ = dir;
    const int utterances = 1600, frames = 300, dim = 33;
    std::string htk;
    auto be32 = [&htk](uint32_t v) { Put<uint32_t>(&htk, __builtin_bswap32(v)); };
    be32(utterances * frames);
    be32(100000);
    Put<uint16_t>(&htk, __builtin_bswap16(static_cast<uint16_t>(4 * dim)));
    Put<uint16_t>(&htk, __builtin_bswap16(9));
    for (int i = 0; i < utterances * frames * dim; ++i) {
      const float f = static_cast<float>(i % 1013) * 0.01f;
      uint32_t u;
      std::memcpy(&u, &f, 4);
      be32(u);
    }
    std::ofstream(dir_ + "/f.htk", std::ios::binary) << htk;
    std::ofstream scp(dir_ + "/f.scp");
    for (int u = 0; u < utterances; ++u) scp << "u" << u << "=f.htk[" << u * frames << "," << u * frames + frames - 1 << "]\n";
    bytes_ = htk.size() - 12;
  }
  ~HtkArchive() {
    for (const char* name : {"/f.htk", "/f.scp"}) std::remove((dir_ + name).c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  const std::string& dir() const { return dir_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string dir_;
  uint64_t bytes_ = 0;
};

void BM_HtkFrames(benchmark::State& state, int window, bool at_assembly) {
  static const HtkArchive archive;
  auto config = ParseConfig(
      "datasets:\n  h:\n    deserializers:\n      - type: HTKFeature\n        chunkSizeInBytes: 1000000000\n"
      "        input: {x: {scpFile: " + archive.dir() + "/f.scp, dim: " + std::to_string(33 * window) +
          ", contextWindow: " + std::to_string(window) + "}}\n",
      "bench", archive.dir());
  DatasetOpenOptions options;
  options.compressed_in_place = at_assembly;
  auto ds = config.ok() ? Dataset::Open(config->datasets[0], options) : absl::StatusOr<std::unique_ptr<Dataset>>(config.status());
  if (!ds.ok()) {
    state.SkipWithError(std::string(ds.status().message()).c_str());
    return;
  }
  if ((*ds)->index().chunks.size() != 1) {
    state.SkipWithError("the archive should be one chunk");
    return;
  }
  std::vector<float> batch((32u << 20) / sizeof(float), 0.0f);
  (void)(*ds)->ParseChunk(0);  // its arrays' memory mapped once, reused by the timed parses
  for (auto _ : state) {
    auto chunk = (*ds)->ParseChunk(0);
    if (!chunk.ok()) {
      state.SkipWithError(std::string(chunk.status().message()).c_str());
      return;
    }
    const ParsedStream& ps = (*chunk)->streams[0];
    size_t at = 0;
    for (uint32_t slot = 0; slot + 1 < ps.sequence_begin.size(); ++slot) {
      const uint64_t n = ps.num_samples(slot), values = n * ps.dim;
      if (at + values > batch.size()) at = 0;
      ps.DecodeDense<float>(slot, 0, n, batch.data() + at);  // a copy, or the codec's decode
      at += values;
    }
    benchmark::DoNotOptimize(batch.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * archive.bytes()));
}
BENCHMARK_CAPTURE(BM_HtkFrames, into_chunk_then_copied, 1, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HtkFrames, at_assembly, 1, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HtkFrames, window11_into_chunk_then_copied, 11, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HtkFrames, window11_at_assembly, 11, true)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor

BENCHMARK_MAIN();
