// The whole loader through an assembler, against the CPU loader (loader_cases.h).
#include "tests/gpu/loader_cases.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/config_loader.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::testing {

using gpu::CopyMemory;
using gpu::MemoryKind;
using gpu::Slot;
using gpu::SlotPool;

namespace {

// Removes the files it was given when the process ends (the datasets read them until then).
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};

std::string ProcessTempFile(const std::string& stem) {
  static TempFiles files;
  files.paths.push_back(::testing::TempDir() + "/" + stem + "." + std::to_string(getpid()));
  return files.paths.back();
}

}  // namespace

void ExpectPipelinedLoaderMatchesTheCpuLoader(const DatasetConfig& config, const DatasetOpenOptions& open,
                                              const LoaderOptions& lo, BatchAssembler* assembler, MemoryKind kind) {
  auto plain = Dataset::Open(config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto ds = Dataset::Open(config, open);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto cpu = MakeCpuAssembler();
  std::vector<std::vector<std::byte>> want;
  {
    auto loader = Loader::Create(plain->get(), cpu.get(), lo);
    ASSERT_TRUE(loader.ok());
    Batch b;
    while (*(*loader)->Next(&b)) want.emplace_back(b.bytes.begin(), b.bytes.end());
  }
  ASSERT_FALSE(want.empty());
  uint64_t largest = 0;
  for (const auto& w : want) largest = std::max<uint64_t>(largest, w.size());
  auto pool = SlotPool::Create(kind, largest, 3);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::deque<Slot> free_slots;
  for (int i = 0; i < 3; ++i) free_slots.push_back(*(*pool)->Acquire(absl::ZeroDuration()));
  std::deque<Slot> used;
  auto loader = Loader::Create(ds->get(), assembler, lo);
  ASSERT_TRUE(loader.ok());
  auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
    if (free_slots.empty() || bytes > largest) return absl::InternalError("no slot");
    used.push_back(free_slots.front());
    free_slots.pop_front();
    return absl::MakeSpan(used.back().data, bytes);
  };
  size_t n = 0;
  absl::Status st = RunPipelined(loader->get(), 2, destination, [&](const Batch& b) -> absl::Status {
    if (n >= want.size()) return absl::InternalError("more batches than the CPU loader's");
    std::vector<std::byte> got(b.bytes.size());
    if (absl::Status copied = CopyMemory(got.data(), b.bytes.data(), got.size()); !copied.ok()) return copied;
    EXPECT_TRUE(got == want[n]) << "batch " << n;
    ++n;
    free_slots.push_back(used.front());
    used.pop_front();
    return absl::OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(n, want.size());
}

DatasetConfig CtfConfig() {
  // One file per process: ctest runs tests in parallel, and rewriting a file another process
  // has mapped would fault there.
  const std::string path = ProcessTempFile("conveyor_gpu_loader.ctf");
  std::FILE* f = std::fopen(path.c_str(), "w");
  for (int i = 0; f != nullptr && i < 3000; ++i) {
    const int len = 1 + i % 5;
    for (int t = 0; t < len; ++t) {
      std::fprintf(f, "%d |x %d:%d.5 %d:1 |y %d %d\n", i, (i * 7 + t) % 1000, t, (i + 3 * t) % 1000, i % 3, t);
    }
  }
  if (f != nullptr) std::fclose(f);
  auto config = ParseConfig(
      "datasets:\n  d:\n    deserializers:\n      - type: CNTKTextFormat\n        chunkSizeInBytes: 4000\n        file: " +
          path + "\n        input:\n          x: {dim: 1000, format: sparse}\n          y: {dim: 2, format: dense}\n",
      "test", "/");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? config->datasets[0] : DatasetConfig();
}

LoaderOptions Randomized(uint64_t minibatch, bool frames) {
  LoaderOptions lo;
  lo.planner.minibatch_size = minibatch;
  lo.planner.randomizer.randomize = true;
  lo.planner.randomizer.window = 3;
  lo.planner.randomizer.frame_mode = frames;
  lo.threads = 2;
  return lo;
}

namespace {

// Kaldi features as CM (1 byte, column headers), CM2 and CM3, with an scp row/column range,
// float and double.
std::vector<DatasetConfig> CompressedKaldiConfigs() {
  std::vector<DatasetConfig> out;
  const std::string kaldi = TestdataDir() + "/kaldi";
  // (Per process, as above.)
  const std::string ranges = ProcessTempFile("conveyor_gpu_cm_ranges.scp");
  if (std::FILE* f = std::fopen(ranges.c_str(), "w")) {
    std::fprintf(f, "r1 %s/cm_auto.ark:14[2:10,3:12]\nr2 %s/cm_auto.ark:1169[0:30,3:12]\n", kaldi.c_str(), kaldi.c_str());
    std::fclose(f);
  }
  for (const std::string& rspecifier : {"scp:" + kaldi + "/cm_auto.scp", "scp:" + kaldi + "/cm_2byte_auto.scp",
                                        "scp:" + kaldi + "/cm_1byte_auto.scp", "scp:" + kaldi + "/cm_speech.scp",
                                        "scp:" + ranges}) {
    for (const char* precision : {"float", "double"}) {
      auto config = ParseConfig(std::string("datasets:\n  d:\n    maxErrors: 1000\n    precision: ") + precision +
                                    "\n    deserializers:\n      - type: KaldiTable\n        chunkSizeInBytes: 3000\n"
                                    "        rspecifier: \"" + rspecifier + "\"\n        input: {features: {}}\n",
                                "test", "/");
      EXPECT_TRUE(config.ok()) << config.status();
      if (config.ok()) out.push_back(config->datasets[0]);
    }
  }
  return out;
}

}  // namespace

void ExpectCompressedKaldiMatchesTheCpuLoader(BatchAssembler* assembler, MemoryKind kind) {
  DatasetOpenOptions open;
  open.compressed_in_place = true;
  open.diagnostics_sink = [](Severity, const std::string&) {};
  for (const DatasetConfig& config : CompressedKaldiConfigs()) {
    for (int mode = 0; mode < 3; ++mode) {
      const bool frames = mode > 0;
      LoaderOptions lo = Randomized(frames ? 64 : 100, frames);
      lo.planner.randomizer.randomize = mode < 2;
      SCOPED_TRACE(config.deserializers[0].rspecifier + (frames ? " frames" : " utterances") +
                   (mode == 2 ? " in order" : "") + (config.precision == Precision::kDouble ? " double" : " float"));
      ExpectPipelinedLoaderMatchesTheCpuLoader(config, open, lo, assembler, kind);
    }
  }
}

namespace {

// Big-endian HTK: a 12-byte header, then `payload` (float32 frames, or _C's A and B vectors and
// int16 frames) as given, already big-endian.
std::string HtkFile(int32_t samples, int16_t sample_bytes, uint16_t kind, const std::string& payload) {
  std::string out;
  const uint32_t head[2] = {__builtin_bswap32(static_cast<uint32_t>(samples)), __builtin_bswap32(100000)};
  const uint16_t tail[2] = {__builtin_bswap16(static_cast<uint16_t>(sample_bytes)), __builtin_bswap16(kind)};
  out.append(reinterpret_cast<const char*>(head), 8);
  out.append(reinterpret_cast<const char*>(tail), 4);
  return out + payload;
}

// The same, little-endian (as CNTK recognises them: by the smaller sample period).
std::string LittleEndianHtkFile(int32_t samples, int16_t sample_bytes, uint16_t kind, const std::string& payload) {
  std::string out;
  const int32_t head[2] = {samples, 100000};
  out.append(reinterpret_cast<const char*>(head), 8);
  out.append(reinterpret_cast<const char*>(&sample_bytes), 2);
  out.append(reinterpret_cast<const char*>(&kind), 2);
  return out + payload;
}

std::string BigEndianFloats(const std::vector<float>& v) {
  std::string out;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = __builtin_bswap32(u);
    out.append(reinterpret_cast<const char*>(&u), 4);
  }
  return out;
}

}  // namespace

void ExpectHtkFramesMatchTheCpuLoader(BatchAssembler* assembler, MemoryKind kind) {
  const int d = 6;
  std::vector<float> frames(600 * d);
  for (size_t i = 0; i < frames.size(); ++i) frames[i] = static_cast<float>((i * 53) % 997) * 0.25f - 100.0f;
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // NaNs with payloads, a signalling one among them: moved as they are, widened to double as
  // the CPU widens them.
  frames[7] = bits(0x7f800001u);
  frames[13] = bits(0xffc12345u);
  // _C: A and B (fractional, so that x + B rounds in float), and the NaNs of (x + B) / A: A = 0
  // with x + B = 0 (0/0), A a NaN, B a signalling NaN.
  const std::vector<float> ab = {2.5f, 3.0f, 0.0f, bits(0x7fc00abcu), 7.25f, 1e-3f,
                                 1000.37f, 0.1f, 0.0f, -3.5f, bits(0x7f800123u), 2.75f};
  std::string c = BigEndianFloats(ab);
  auto x_of = [&](int i) { return static_cast<int16_t>(i % d == 2 && (i / d) % 3 == 0 ? 0 : (i * 211) % 30000 - 15000); };
  for (int i = 0; i < 150 * d; ++i) {
    const uint16_t v = __builtin_bswap16(static_cast<uint16_t>(x_of(i)));
    c.append(reinterpret_cast<const char*>(&v), 2);
  }
  // Little-endian files too: float32 frames, and _C (its vectors and values little-endian).
  std::string lf(reinterpret_cast<const char*>(frames.data()), 50 * d * sizeof(float));
  std::string lc(reinterpret_cast<const char*>(ab.data()), ab.size() * sizeof(float));
  for (int i = 0; i < 30 * d; ++i) {
    const int16_t v = x_of(i * 7);
    lc.append(reinterpret_cast<const char*>(&v), 2);
  }
  // (Per process, as above.)
  const std::string f = ProcessTempFile("conveyor_gpu_htk_f.htk"), cf = ProcessTempFile("conveyor_gpu_htk_c.htk");
  const std::string lff = ProcessTempFile("conveyor_gpu_htk_lf.htk"), lcf = ProcessTempFile("conveyor_gpu_htk_lc.htk");
  const std::string scp = ProcessTempFile("conveyor_gpu_htk.scp");
  for (const auto& [path, bytes] : {std::make_pair(f, HtkFile(600, 4 * d, 9, BigEndianFloats(frames))),
                                    std::make_pair(cf, HtkFile(4 + 150, 2 * d, 9 | 02000, c)),
                                    std::make_pair(lff, LittleEndianHtkFile(50, 4 * d, 9, lf)),
                                    std::make_pair(lcf, LittleEndianHtkFile(4 + 30, 2 * d, 9 | 02000, lc))}) {
    if (std::FILE* out = std::fopen(path.c_str(), "wb")) {
      std::fwrite(bytes.data(), 1, bytes.size(), out);
      std::fclose(out);
    }
  }
  if (std::FILE* out = std::fopen(scp.c_str(), "w")) {
    for (int u = 0; u < 20; ++u) std::fprintf(out, "u%d=%s[%d,%d]\n", u, f.c_str(), 20 * u, 20 * u + 19 - u % 7);
    std::fprintf(out, "c=%s\nc1=%s[3,4]\n", cf.c_str(), cf.c_str());
    // One utterance longer than the device's ops (kDecodeOpValues: bands of rows, with a
    // window), and the little-endian files, whole and a range.
    std::fprintf(out, "long=%s[0,599]\nlf=%s\nlf1=%s[10,12]\nlc=%s\n", f.c_str(), lff.c_str(), lff.c_str(), lcf.c_str());
    std::fclose(out);
  }
  DatasetOpenOptions open;
  open.compressed_in_place = true;
  for (const char* context : {"", ", contextWindow: [3, 2]"}) {
    for (const std::string variant : {"float", "double", "float16"}) {
      // float16: float data narrowed (the program builds the float32 twin, then narrows it).
      const char* precision = variant == "double" ? "double" : "float";
      auto config = ParseConfig(absl::StrCat("datasets:\n  d:\n    precision: ", precision,
                                             "\n    deserializers:\n      - type: HTKFeature\n        chunkSizeInBytes: 3000\n"
                                             "        input: {x: {scpFile: \"", scp, "\", dim: ", *context ? 6 * d : d, context, "}}\n"),
                                "test", "/");
      ASSERT_TRUE(config.ok()) << config.status();
      for (int mode = 0; mode < 3; ++mode) {
        const bool by_frame = mode > 0;
        LoaderOptions lo = Randomized(by_frame ? 64 : 100, by_frame);
        lo.planner.randomizer.randomize = mode < 2;
        if (variant == "float16") lo.value_dtypes = {DType::kFloat16};
        SCOPED_TRACE(absl::StrCat(*context ? "window [3, 2]" : "no window", by_frame ? " frames" : " utterances",
                                  mode == 2 ? " in order " : " ", variant));
        ExpectPipelinedLoaderMatchesTheCpuLoader(config->datasets[0], open, lo, assembler, kind);
      }
    }
  }
}

}  // namespace conveyor::testing
