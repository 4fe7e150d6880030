// staging_bench: the host's share of GPU assembly, measured without a GPU. For Kaldi
// compressed archives (tests/data/kaldi: CM, CM2, CM3), the whole loader runs N epochs two ways:
//   cpu      parser threads decode every matrix, the CPU assembler copies floats (today's
//            path without a device);
//   staging  chunks keep the matrices compressed (compressed_in_place), and the assembler
//            only does what the CUDA assembler's host half does: build the assembly program
//            and pack the staging buffer (the stored bytes of the rows taken) - the device
//            would then decode.
// Reported per archive: MB/s of archive (wall) and CPU seconds per GB of archive (all
// threads, getrusage), plus the staged bytes per decoded float byte.
//   build/bench/staging_bench [epochs [archive]]
// Or any dataset of a config (HTK features, whose frames are sent as they lie and whose context
// windows the device builds): the same two ways, per GB of the batches' input.
//   build/bench/staging_bench epochs CONFIG.yaml DATASET
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"
#include "cuda/assembly_program.h"

namespace conveyor {
namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The CUDA assembler's host half only: program and staging, no execution.
class StagingOnlyAssembler final : public BatchAssembler {
 public:
  const char* name() const override { return "staging"; }
  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) override {
    if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
    auto prog = gpu::BuildAssemblyProgram(plan, pieces);
    if (!prog.ok()) return prog.status();
    if (staging_.size() < prog->staging_bytes) staging_.resize(prog->staging_bytes);
    gpu::PackStaging(*prog, staging_.data());
    staged += prog->staging_bytes;
    return absl::OkStatus();
  }
  uint64_t staged = 0;

 private:
  std::vector<std::byte> staging_;
};

struct Run {
  double seconds = 0, cpu_seconds = 0;
  uint64_t batch_bytes = 0;
};

Run Read(const Dataset& ds, BatchAssembler* assembler, uint64_t epochs, bool frames) {
  StreamRequest r;
  r.randomize = true;
  r.seed = 1;
  r.minibatch_size = frames ? 256 : 2000;
  r.frame_mode = frames;
  r.epochs = epochs;
  r.threads = 1;
  auto resolved = ResolveStream(ds, r);
  if (!resolved.ok()) std::exit(1);
  auto loader = Loader::Create(&ds, assembler, resolved->loader);
  if (!loader.ok()) std::exit(1);
  Run run;
  const double c0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  Batch b;
  while (true) {
    auto more = (*loader)->Next(&b);
    if (!more.ok()) {
      std::fprintf(stderr, "%s\n", std::string(more.status().message()).c_str());
      std::exit(1);
    }
    if (!*more) break;
    run.batch_bytes += b.plan.total_bytes;
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.cpu_seconds = CpuSeconds() - c0;
  return run;
}

}  // namespace
}  // namespace conveyor

// Both ways over `config`'s dataset, a line per mode, per GB of its files read.
int Compare(const char* label, const conveyor::DatasetConfig& config, uint64_t epochs) {
  using namespace conveyor;
  DatasetOpenOptions kept_open;
  kept_open.compressed_in_place = true;
  auto plain = Dataset::Open(config);
  auto kept = Dataset::Open(config, kept_open);
  if (!plain.ok() || !kept.ok()) {
    std::fprintf(stderr, "%s\n", std::string((plain.ok() ? kept.status() : plain.status()).message()).c_str());
    return 1;
  }
  const double gb = (*plain)->file_bytes() / 1e9 * epochs;
  for (bool frames : {false, true}) {
    auto cpu = MakeCpuAssembler();
    StagingOnlyAssembler staging;
    const Run a = Read(**plain, cpu.get(), epochs, frames);
    const Run b = Read(**kept, &staging, epochs, frames);
    std::printf("%-16s %-10s %12.0f %12.2f %12.0f %12.2f %10.3f\n", label, frames ? "frames" : "utterances",
                gb * 1e3 / a.seconds, a.cpu_seconds / gb, gb * 1e3 / b.seconds, b.cpu_seconds / gb,
                static_cast<double>(staging.staged) / std::max<uint64_t>(b.batch_bytes, 1));
  }
  return 0;
}

int main(int argc, char** argv) {
  using namespace conveyor;
  const uint64_t epochs = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200;
  if (argc > 3) {  // a config's dataset
    auto config = LoadConfigFile(argv[2]);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    for (const DatasetConfig& d : config->datasets) {
      if (d.name != argv[3]) continue;
      std::printf("%-16s %-10s %12s %12s %12s %12s %10s\n", "dataset", "mode", "cpu MB/s", "cpu s/GB", "staging MB/s",
                  "staging s/GB", "staged/out");
      return Compare(argv[3], d, epochs);
    }
    std::fprintf(stderr, "no dataset %s in %s\n", argv[3], argv[2]);
    return 1;
  }
  const char* env = std::getenv("CONVEYOR_TESTDATA");
  const std::string kaldi = std::string(env != nullptr ? env : CONVEYOR_TESTDATA_DIR) + "/kaldi";
  std::printf("%-16s %-10s %12s %12s %12s %12s %10s\n", "archive", "mode", "cpu MB/s", "cpu s/GB", "staging MB/s",
              "staging s/GB", "staged/f32");
  for (const char* name : {"cm_speech", "cm_2byte_auto", "cm_1byte_auto"}) {
    if (argc > 2 && std::string(argv[2]) != name) continue;
    auto config = ParseConfig(std::string("datasets:\n  d:\n    deserializers:\n      - type: KaldiTable\n"
                                          "        rspecifier: \"ark:") + kaldi + "/" + name + ".ark\"\n"
                                          "        input: {features: {}}\n",
                              "staging_bench", "/");
    if (!config.ok() || Compare(name, config->datasets[0], epochs) != 0) return 1;
  }
  return 0;
}
