// gpu_bench: the GPU figures of issue 7, each next to its physical reference measured in
// the same run (device/METHOD.md): a large device-to-device copy (bytes read + written), a
// pinned host-to-device copy and one from a pinned pool's slot, then the CUDA assembler end to
// end (host packing included) on generated batches with the number of ops of each kernel
// (each one block or thread: how much of the device a batch can keep busy), utterances of
// Kaldi compressed matrices (decode ops only), and Kaldi CM decoding on the device next to
// the CPU decoder on one core. Ends with SUMMARY lines: each figure next to its target.
// With `--examples CONFIG`, every dataset of CONFIG (examples/conveyor.yaml; or
// /tmp/scal/scaling.yaml once bench/scaling.py has made its data: HTK with 11-frame windows,
// Kaldi CM) also goes through the whole loader, opened as the daemon opens it: batches/s with the CPU assembler into host memory, and with the
// CUDA assembler into device slots one batch at a time and pipelined (two in flight, as the
// daemon runs it), with the share of the wall time the host spent waiting for the device
// (near 0: the device idles between batches, the host is the bound; near 1: the device is).
// Batches into host memory (shm/inline with --assembler cuda): copied back asynchronously
// into registered or pageable buffers, next to assembling and copying one at a time.
// Medians of repeated runs after a warm-up. Prints a table; `--json` prints one JSON line.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/formats/kaldi/kaldi_object.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"
#include "cuda/assembly_program.h"
#include "cuda/cases/batch_cases.h"
#include "cuda/cases/compressed_cases.h"
#include "cuda/cuda_assembler.h"
#include "cuda/kaldi_cm_device.h"
#include "cuda/slot_pool.h"

namespace {

#define CHECK_CUDA(x)                                                                              \
  do {                                                                                             \
    cudaError_t e = (x);                                                                           \
    if (e != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));      \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one cudaMemcpyAsync, timed with events; median of `reps` after a warm-up.
double TimeCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(t);
}

double Now();

struct LoaderRun {
  double batches_per_s = 0, wait_share = 0;
  uint64_t batches = 0, bytes = 0;
};

// One pass of `epochs` epochs through `dataset` (keepDataInMemory: parsing once, then
// planning and assembly). `depth` 0: Next() into a host buffer with the CPU assembler.
LoaderRun RunLoader(const conveyor::Dataset& dataset, conveyor::BatchAssembler* assembler, size_t depth,
                    uint64_t minibatch, uint64_t epochs, std::vector<std::byte*>& slots, uint64_t slot_bytes) {
  using namespace conveyor;
  StreamRequest r;
  r.randomize = true;
  r.seed = 1;
  r.minibatch_size = minibatch;
  r.epochs = epochs;
  r.threads = 2;
  auto resolved = ResolveStream(dataset, r);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s\n", std::string(resolved.status().message()).c_str());
    std::exit(1);
  }
  auto loader = Loader::Create(&dataset, assembler, resolved->loader);
  if (!loader.ok()) std::exit(1);
  LoaderRun run;
  double waited = 0;
  const double t0 = Now();
  Batch b;
  if (depth == 0) {
    while (true) {
      auto more = (*loader)->Next(&b);
      if (!more.ok()) {
        std::fprintf(stderr, "%s\n", std::string(more.status().message()).c_str());
        std::exit(1);
      }
      if (!*more) break;
      ++run.batches;
      run.bytes += b.plan.total_bytes;
    }
  } else {
    size_t next_slot = 0;
    auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
      if (bytes > slot_bytes) return absl::ResourceExhaustedError("gpu_bench: a batch larger than its slots");
      return absl::MakeSpan(slots[next_slot++ % slots.size()], bytes);
    };
    bool more = true;
    while (more || (*loader)->in_flight() > 0) {
      while (more && (*loader)->in_flight() < depth) {
        auto begun = (*loader)->Begin(destination);
        if (!begun.ok()) {
          std::fprintf(stderr, "%s\n", std::string(begun.status().message()).c_str());
          std::exit(1);
        }
        more = *begun;
      }
      if ((*loader)->in_flight() == 0) break;
      const double w = Now();
      if (!(*loader)->Complete(&b).ok()) std::exit(1);
      waited += Now() - w;
      ++run.batches;
      run.bytes += b.plan.total_bytes;
    }
  }
  const double sec = Now() - t0;
  run.batches_per_s = run.batches / sec;
  run.wait_share = waited / sec;
  return run;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string RandomCm(int rows, int cols, std::mt19937& rng) {
  std::string s("\0BCM ", 5);
  auto put = [&](auto v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(-10.0f);
  put(20.0f);
  put(static_cast<int32_t>(rows));
  put(static_cast<int32_t>(cols));
  for (int c = 0; c < cols; ++c) {
    uint16_t p[4];
    for (uint16_t& v : p) v = static_cast<uint16_t>(rng());
    std::sort(p, p + 4);
    for (uint16_t v : p) put(v);
  }
  for (int64_t i = 0; i < int64_t{rows} * cols; ++i) s.push_back(static_cast<char>(rng()));
  return s;
}

// Seconds per batch of `plan` through `assembler` (AssembleAsync into 4 device slots in
// turn, 200 batches after 10 of warm-up: host packing and device work overlapped as in the
// daemon); prints the case's row.
double TimeAssembly(conveyor::gpu::CudaAssembler* assembler, const std::string& name, const conveyor::BatchPlan& plan,
                    const std::vector<conveyor::PieceRef>& pieces, double d2d) {
  using namespace conveyor;
  auto prog = gpu::BuildAssemblyProgram(plan, pieces);
  auto pool = gpu::SlotPool::Create(gpu::MemoryKind::kDevice, plan.total_bytes, 4);
  if (!pool.ok() || !prog.ok()) std::exit(1);
  std::vector<std::byte*> slots;
  for (int i = 0; i < 4; ++i) slots.push_back((*pool)->Acquire(absl::ZeroDuration())->data);
  const int reps = 200;
  for (int i = 0; i < 10; ++i) (void)assembler->AssembleAsync(plan, pieces, slots[i % 4]);
  (void)assembler->Synchronize();
  const double t0 = Now();
  for (int i = 0; i < reps; ++i) {
    absl::Status st = assembler->AssembleAsync(plan, pieces, slots[i % 4]);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(st.message()).c_str());
      std::exit(1);
    }
  }
  if (absl::Status st = assembler->Synchronize(); !st.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(st.message()).c_str());
    std::exit(1);
  }
  const double sec = (Now() - t0) / reps;
  const double gbs = plan.total_bytes / sec / 1e9;
  std::printf("%-24s %9.2f %11.0f %10.2f %7.1f%% %9.2f %zu/%zu/%zu/%zu/%zu\n", name.c_str(), plan.total_bytes / 1e6, 1 / sec,
              gbs, 100 * gbs / d2d, prog->staging_bytes / sec / 1e9, prog->copies.size(), prog->csc_pieces.size(),
              prog->scatters.size(), prog->decodes.size(), prog->transposes.size());
  return sec;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "gpu_bench: into host memory (%s): %s\n", what.c_str(), std::string(st.message()).c_str());
  std::exit(1);
}

// Batches/s of `plan` into host memory (two buffers in turn, the daemon's loop: begin batch
// k+1, then wait for k), 200 batches after 10 of warm-up. `how`: "registered" (the buffers
// page-locked after they were made, as the shm and inline transports do: the copy back is a
// DMA on the copy stream, overlapping the next batch's assembly), "pageable" (through the
// assembler's pinned buffer, then a host copy), or "serial" (the old path's cost: each
// batch assembled into device memory, then copied to a pinned buffer by a synchronous
// cudaMemcpy before the next begins; into pinned memory, so the ratio shows the overlap
// alone: the old path copied into pageable shm/inline memory, slower still).
double HostDestinationBatchesPerSecond(conveyor::gpu::CudaAssembler* assembler, const conveyor::BatchPlan& plan,
                                       const std::vector<conveyor::PieceRef>& pieces, const std::string& how) {
  using namespace conveyor;
  const uint64_t bytes = plan.total_bytes;
  std::vector<std::byte*> buffers;
  std::vector<std::unique_ptr<gpu::HostRegistration>> locks;
  for (int i = 0; i < 2; ++i) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) Die(how, absl::ResourceExhaustedError("mmap of a host buffer failed"));
    buffers.push_back(static_cast<std::byte*>(p));
    if (how == "registered") {
      auto locked = gpu::RegisterHostMemory(p, bytes, 0);
      if (!locked.ok()) Die(how, locked.status());
      locks.push_back(std::move(*locked));
    }
  }
  std::byte* device = nullptr;
  void* pinned = nullptr;
  if (how == "serial") {
    CHECK_CUDA(cudaMalloc(&device, bytes));
    CHECK_CUDA(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  }
  auto run = [&](int n) {
    uint64_t previous = 0;
    for (int i = 0; i < n; ++i) {
      if (how == "serial") {
        if (absl::Status st = assembler->Assemble(plan, pieces, absl::MakeSpan(device, bytes)); !st.ok()) Die(how, st);
        CHECK_CUDA(cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost));
        continue;
      }
      auto fence = assembler->Begin(plan, pieces, absl::MakeSpan(buffers[i % 2], bytes));
      if (!fence.ok()) Die(how, fence.status());
      if (i > 0) {
        if (absl::Status st = assembler->Wait(previous); !st.ok()) Die(how, st);
      }
      previous = *fence;
    }
    if (how != "serial" && n > 0) {
      if (absl::Status st = assembler->Wait(previous); !st.ok()) Die(how, st);
    }
  };
  run(10);
  const double t0 = Now();
  run(200);
  const double per_s = 200 / (Now() - t0);
  locks.clear();
  for (std::byte* b : buffers) munmap(b, bytes);
  if (device != nullptr) cudaFree(device);
  if (pinned != nullptr) cudaFreeHost(pinned);
  return per_s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace conveyor;
  bool json = false;
  std::string examples;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json = true;
    else if (std::strcmp(argv[i], "--examples") == 0 && i + 1 < argc) examples = argv[++i];
    else {
      std::fprintf(stderr, "usage: gpu_bench [--json] [--examples examples/conveyor.yaml]\n");
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "gpu_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // References: D2D copy (read + write counted) and pinned H2D.
  const size_t big = size_t{1} << 30;
  void *d0, *d1, *h;
  CHECK_CUDA(cudaMalloc(&d0, big));
  CHECK_CUDA(cudaMalloc(&d1, big));
  CHECK_CUDA(cudaHostAlloc(&h, big / 4, cudaHostAllocDefault));
  CHECK_CUDA(cudaMemset(d0, 1, big));
  std::memset(h, 1, big / 4);
  const double d2d = 2.0 * big / TimeCopy(d1, d0, big, cudaMemcpyDeviceToDevice, s, 10) / 1e9;
  const double h2d = (big / 4.0) / TimeCopy(d1, h, big / 4, cudaMemcpyHostToDevice, s, 10) / 1e9;
  // H2D from a slot of a pinned pool (SlotPool: cudaHostAllocPortable, one allocation carved
  // into slots, as the daemon's pinned slots are), the same size, next to the plain copy.
  double pool_h2d = 0;
  if (auto pinned = gpu::SlotPool::Create(gpu::MemoryKind::kPinned, big / 8, 2); pinned.ok()) {
    auto first = (*pinned)->Acquire(absl::ZeroDuration());
    auto slot = (*pinned)->Acquire(absl::ZeroDuration());  // the second slot: not at the allocation's start
    if (first.ok() && slot.ok()) {
      std::memset(slot->data, 1, big / 8);
      pool_h2d = (big / 8.0) / TimeCopy(d1, slot->data, big / 8, cudaMemcpyHostToDevice, s, 10) / 1e9;
    }
  }
  const double plain_h2d = (big / 8.0) / TimeCopy(d1, h, big / 8, cudaMemcpyHostToDevice, s, 10) / 1e9;
  cudaFree(d1);
  cudaFreeHost(h);

  std::printf("device: %s\nreference: D2D copy %.0f GB/s (read+write), pinned H2D %.1f GB/s\n", prop.name, d2d, h2d);
  std::printf("H2D from a pinned pool slot %.1f GB/s, plain pinned copy of the same size %.1f GB/s (%.0f%%)\n", pool_h2d,
              plain_h2d, 100 * pool_h2d / plain_h2d);
  std::printf("assembly per batch (host packing and device work, 4 slots in turn; ops: copy items, CSC piece ops,\n"
              "scatter ops, decode ops, CSR transposes, each one block or thread):\n");
  std::printf("%-24s %9s %11s %10s %8s %9s %s\n", "case", "slot MB", "batches/s", "slot GB/s", "vs D2D", "H2D GB/s",
              "ops c/p/s/d/t");
  auto assembler = gpu::CudaAssembler::Create({});
  if (!assembler.ok()) {
    std::fprintf(stderr, "%s\n", std::string(assembler.status().message()).c_str());
    return 1;
  }
  std::string js = "{";
  double best = 0, total_bytes = 0, total_seconds = 0;
  std::string best_case;
  auto row = [&](const std::string& name, const BatchPlan& plan, const std::vector<PieceRef>& pieces) {
    const double sec = TimeAssembly(assembler->get(), name, plan, pieces, d2d);
    const double gbs = plan.total_bytes / sec / 1e9;
    total_bytes += plan.total_bytes;
    total_seconds += sec;
    if (gbs > best) best = gbs, best_case = name;
    js += "\"" + name + "\": {\"batches_per_s\": " + std::to_string(1 / sec) + ", \"slot_gb_s\": " + std::to_string(gbs) +
          "}, ";
  };
  for (const auto& spec : testing::StandardCases()) {
    auto c = testing::MakeBatchCase(spec, 1);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    if (!plan.ok()) return 1;
    if (plan->total_bytes < (64 << 10)) continue;  // latency-bound: launches, not bytes
    row(spec.name, *plan, c.pieces);
  }
  // Utterances of Kaldi compressed matrices left compressed: the decode ops (bands of rows,
  // kDecodeOpValues values each) are the whole work.
  std::mt19937 cm_rng(2);
  for (int format : {1, 2}) {
    std::vector<std::string> objects;
    for (int i = 0; i < 32; ++i) objects.push_back(testing::RandomCompressed(format, 1000, 40, cm_rng));
    auto c = testing::MakeCompressedCase(objects, 0, 0, 40, testing::CompressedPieces::kUtterances, 1);
    auto plan = PlanBatch(c.streams, Precision::kFloat, c.shape, c.pieces);
    if (!plan.ok()) return 1;
    row(format == 1 ? "cm_utterances_32x1000" : "cm2_utterances_32x1000", *plan, c.pieces);
  }
  const double all_gbs = total_bytes / total_seconds / 1e9;

  // Batches bound for host memory (--assembler cuda with the shm or inline transport): the
  // largest standard case, copied back asynchronously (registered or pageable destinations)
  // next to assembling and copying one after the other (what the daemon did before).
  std::string host_summary;
  {
    // The largest case, made again where it stays: its pieces point into the case.
    const std::vector<testing::CaseSpec> specs = testing::StandardCases();
    size_t pick = 0;
    uint64_t most = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto c = testing::MakeBatchCase(specs[i], 3);
      auto plan = PlanBatch(c.streams, specs[i].precision, c.shape, c.pieces, c.layouts);
      if (!plan.ok()) return 1;
      if (plan->total_bytes > most) most = plan->total_bytes, pick = i;
    }
    const testing::BatchCase c = testing::MakeBatchCase(specs[pick], 3);
    auto planned = PlanBatch(c.streams, specs[pick].precision, c.shape, c.pieces, c.layouts);
    if (!planned.ok()) return 1;
    const BatchPlan* largest_plan = &*planned;
    const testing::BatchCase* largest = &c;
    const std::string largest_name = specs[pick].name;
    const double registered = HostDestinationBatchesPerSecond(assembler->get(), *largest_plan, largest->pieces, "registered");
    const double pageable = HostDestinationBatchesPerSecond(assembler->get(), *largest_plan, largest->pieces, "pageable");
    const double serial = HostDestinationBatchesPerSecond(assembler->get(), *largest_plan, largest->pieces, "serial");
    const double mb = largest_plan->total_bytes / 1e6;
    std::printf("into host memory, %s (%.2f MB): registered %.0f batches/s (%.2f GB/s), pageable %.0f, assembled then "
                "copied one at a time %.0f: %.2fx\n",
                largest_name.c_str(), mb, registered, registered * mb / 1e3, pageable, serial, registered / serial);
    js += "\"host_registered_batches_per_s\": " + std::to_string(registered) + ", \"host_pageable_batches_per_s\": " +
          std::to_string(pageable) + ", \"host_serial_batches_per_s\": " + std::to_string(serial) + ", ";
    char line[512];
    std::snprintf(line, sizeof line,
                  "SUMMARY into host memory (shm/inline with --assembler cuda), %s: registered %.0f batches/s, "
                  "pageable %.0f, one at a time %.0f: copy-back overlap %.2fx\n",
                  largest_name.c_str(), registered, pageable, serial, registered / serial);
    host_summary = line;
  }

  // Kaldi CM: device decode vs the CPU decoder (one core) on the same 64 matrices.
  std::mt19937 rng(1);
  std::vector<std::string> objects;
  std::vector<gpu::CompressedJob> jobs;
  uint64_t floats = 0, bytes = 0;
  for (int i = 0; i < 64; ++i) objects.push_back(RandomCm(1000, 40, rng));
  for (const std::string& o : objects) {
    auto info = kaldi::ScanObject(o, 0, kaldi::ObjectKind::kMatrix);
    if (!info.ok()) return 1;
    jobs.push_back({o, 0, *info, floats});
    floats += info->rows * info->cols;
    bytes += o.size();
  }
  auto decoder = gpu::DeviceCmDecoder::Create(0);
  if (!decoder.ok()) return 1;
  float* out;
  CHECK_CUDA(cudaMalloc(&out, floats * sizeof(float)));
  std::vector<double> dev_t, cpu_t;
  std::vector<float> host(floats);
  for (int i = 0; i < 22; ++i) {
    double t0 = Now();
    if (!(*decoder)->Decode(jobs, out).ok()) return 1;
    if (i >= 2) dev_t.push_back(Now() - t0);
    t0 = Now();
    for (const auto& j : jobs) kaldi::DecodeMatrix<float>(j.bytes, 0, j.info, {0, j.info.rows, 0, j.info.cols}, host.data() + j.out_offset);
    if (i >= 2) cpu_t.push_back(Now() - t0);
  }
  const double dev = bytes / Median(dev_t) / 1e6, cpu = bytes / Median(cpu_t) / 1e6;
  std::printf("Kaldi CM decode: device %.0f MB/s of archive (H2D included), CPU one core %.0f MB/s, ratio %.1f\n", dev, cpu,
              dev / cpu);
  // The loader sections: one CUDA assembler, one CPU assembler, four 64 MiB device slots.
  auto cuda_assembler = gpu::CudaAssembler::Create({});
  if (!cuda_assembler.ok()) return 1;
  auto cpu_assembler = MakeCpuAssembler();
  const uint64_t slot_bytes = uint64_t{64} << 20;
  auto loader_pool = gpu::SlotPool::Create(gpu::MemoryKind::kDevice, slot_bytes, 4);
  if (!loader_pool.ok()) return 1;
  std::vector<std::byte*> slots;
  for (int i = 0; i < 4; ++i) slots.push_back((*loader_pool)->Acquire(absl::ZeroDuration())->data);
  std::string summary;  // SUMMARY lines of the example datasets
  if (!examples.empty()) {
    auto config = LoadConfigFile(examples);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    std::printf("example datasets through the loader (randomized, minibatch 256, parsed once):\n");
    std::printf("%-12s %9s %14s %14s %16s %12s\n", "dataset", "batch KB", "cpu batches/s", "cuda 1 at once",
                "cuda pipelined", "host waits");
    for (DatasetConfig dc : config->datasets) {
      dc.keep_data_in_memory = true;
      // Opened as the daemon opens them: Kaldi CM and HTK frames left in their files for the
      // assembler (the CUDA program decodes CM and builds HTK windows on the device).
      DatasetOpenOptions open;
      open.compressed_in_place = true;
      auto ds = Dataset::Open(dc, open);
      if (!ds.ok()) {
        std::fprintf(stderr, "%s: %s\n", dc.name.c_str(), std::string(ds.status().message()).c_str());
        continue;
      }
      const uint64_t epochs = 20;
      (void)RunLoader(**ds, cpu_assembler.get(), 0, 256, 1, slots, slot_bytes);  // parses, warms up
      std::vector<double> c, one, two, wait;
      LoaderRun last;
      for (int rep = 0; rep < 3; ++rep) {
        c.push_back(RunLoader(**ds, cpu_assembler.get(), 0, 256, epochs, slots, slot_bytes).batches_per_s);
        one.push_back(RunLoader(**ds, cuda_assembler->get(), 1, 256, epochs, slots, slot_bytes).batches_per_s);
        last = RunLoader(**ds, cuda_assembler->get(), 2, 256, epochs, slots, slot_bytes);
        two.push_back(last.batches_per_s);
        wait.push_back(last.wait_share);
      }
      const double kb = last.batches ? last.bytes / 1e3 / last.batches : 0;
      std::printf("%-12s %9.1f %14.0f %14.0f %16.0f %11.0f%%\n", dc.name.c_str(), kb, Median(c), Median(one), Median(two),
                  100 * Median(wait));
      char line[256];
      std::snprintf(line, sizeof(line),
                    "SUMMARY example %-10s batches/s: cpu %.0f, cuda one at a time %.0f, cuda pipelined %.0f; host-wait "
                    "share %.0f%%\n",
                    dc.name.c_str(), Median(c), Median(one), Median(two), 100 * Median(wait));
      summary += line;
      js += "\"loader_" + dc.name + "\": {\"cpu_batches_per_s\": " + std::to_string(Median(c)) +
            ", \"cuda_sync_batches_per_s\": " + std::to_string(Median(one)) + ", \"cuda_pipelined_batches_per_s\": " +
            std::to_string(Median(two)) + ", \"host_wait_share\": " + std::to_string(Median(wait)) + "}, ";
    }
  }
  // Kaldi CM in the data path: the whole loader over tests/data/kaldi's CM archives (utterances,
  // randomized, re-parsed every epoch). CPU: parser threads decode, the CPU assembler copies.
  // CUDA: chunks keep the matrices compressed and the device decodes the rows batches take.
  const char* testdata = std::getenv("CONVEYOR_TESTDATA");
  const std::string kaldi_dir = std::string(testdata != nullptr ? testdata : CONVEYOR_TESTDATA_DIR) + "/kaldi";
  if (FILE* probe = std::fopen((kaldi_dir + "/cm_auto.ark").c_str(), "r")) {
    std::fclose(probe);
    std::printf("Kaldi compressed archives through the loader (MB/s of archive, 100 epochs, 2 parser threads):\n");
    std::printf("%-16s %14s %16s %8s\n", "archive", "cpu decode", "device decode", "ratio");
    for (const char* name : {"cm_auto", "cm_2byte_auto", "cm_1byte_auto"}) {
      auto config = ParseConfig(std::string("datasets:\n  d:\n    deserializers:\n      - type: KaldiTable\n"
                                            "        rspecifier: \"ark:") + kaldi_dir + "/" + name + ".ark\"\n"
                                            "        input: {features: {}}\n",
                                "gpu_bench", "/");
      if (!config.ok()) return 1;
      DatasetOpenOptions plain_open, kept_open;
      kept_open.compressed_in_place = true;
      auto plain = Dataset::Open(config->datasets[0], plain_open);
      auto kept = Dataset::Open(config->datasets[0], kept_open);
      if (!plain.ok() || !kept.ok()) return 1;
      const double mb = (*plain)->file_bytes() * 100 / 1e6;
      std::vector<double> c, d;
      for (int rep = 0; rep < 3; ++rep) {
        const LoaderRun a = RunLoader(**plain, cpu_assembler.get(), 0, 2000, 100, slots, slot_bytes);
        const LoaderRun b = RunLoader(**kept, cuda_assembler->get(), 2, 2000, 100, slots, slot_bytes);
        c.push_back(mb * a.batches_per_s / std::max<uint64_t>(a.batches, 1));
        d.push_back(mb * b.batches_per_s / std::max<uint64_t>(b.batches, 1));
      }
      std::printf("%-16s %14.0f %16.0f %8.2f\n", name, Median(c), Median(d), Median(d) / Median(c));
      js += "\"kaldi_" + std::string(name) + "\": {\"cpu_mb_s\": " + std::to_string(Median(c)) +
            ", \"device_mb_s\": " + std::to_string(Median(d)) + "}, ";
    }
  }
  js += "\"d2d_gb_s\": " + std::to_string(d2d) + ", \"h2d_gb_s\": " + std::to_string(h2d) +
        ", \"pool_h2d_gb_s\": " + std::to_string(pool_h2d) + ", \"plain_h2d_gb_s\": " + std::to_string(plain_h2d) +
        ", \"assembly_gb_s\": " + std::to_string(all_gbs) + ", \"cm_device_mb_s\": " + std::to_string(dev) +
        ", \"cm_cpu_mb_s\": " + std::to_string(cpu) + "}";
  if (json) std::printf("%s\n", js.c_str());
  // The figures the GPU assembler is held to, each next to its reference from this run
  // (run.sh collects the SUMMARY lines).
  std::printf("SUMMARY assembly %.1f GB/s over the cases above vs cudaMemcpy D2D %.0f GB/s: %.0f%% (target >= 60%%); "
              "best %.1f GB/s (%s, %.0f%%)\n",
              all_gbs, d2d, 100 * all_gbs / d2d, best, best_case.c_str(), 100 * best / d2d);
  std::printf("SUMMARY H2D from a pinned pool slot %.1f GB/s vs a plain pinned copy %.1f GB/s: %.0f%% (target >= 80%%)\n",
              pool_h2d, plain_h2d, 100 * pool_h2d / plain_h2d);
  std::printf("%s", host_summary.c_str());
  std::printf("%s", summary.c_str());
  cudaFree(out);
  cudaFree(d0);
  return 0;
}
