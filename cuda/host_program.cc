// Assembly programs on the host executor. Compiled with -ffp-contract=off (the decode ops'
// Kaldi arithmetic, as the device's --fmad=false) and -fno-strict-aliasing (the kernels view
// staged bytes through the types the device reads them as): cuda/CMakeLists.txt.
#include "cuda/host_program.h"

#include <cstdlib>
#include <cstring>
#include <vector>

namespace conveyor::gpu {
namespace {

// The host side of program_runner.h: kernels through the host executor, scans in order.
class HostBackend {
 public:
  explicit HostBackend(const HostLaunch& launch) : launch_(launch) {}

  LaunchPolicy policy() const { return launch_.policy; }

  template <typename K>
  absl::Status Launch(const K& kernel, LaunchShape shape, const char*) {
    RunOnHost(kernel, shape, launch_.order);
    return absl::OkStatus();
  }

  template <typename P>
  absl::Status ExclusiveScan(const P* in, uint64_t n, P* out) {
    P sum = 0;
    for (uint64_t i = 0; i < n; ++i) {
      out[i] = sum;
      sum += in[i];
    }
    return absl::OkStatus();
  }

  absl::Status Zero(std::byte* p, uint64_t bytes) {
    if (bytes > 0) std::memset(p, 0, bytes);
    return absl::OkStatus();
  }

 private:
  const HostLaunch launch_;
};

// 256-byte aligned host memory, as cudaMalloc gives.
struct AlignedBytes {
  explicit AlignedBytes(uint64_t bytes, int fill)
      : data(static_cast<std::byte*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256))) {
    if (data != nullptr) std::memset(data, fill, (bytes + 255) / 256 * 256 + 256);
  }
  ~AlignedBytes() { std::free(data); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  std::byte* data;
};

class HostProgramAssembler final : public BatchAssembler {
 public:
  HostProgramAssembler(const HostLaunch& launch, ProgramStats* stats) : launch_(launch), stats_(stats) {}

  const char* name() const override { return "host-program"; }

  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) override {
    if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
    absl::StatusOr<AssemblyProgram> prog = BuildAssemblyProgram(plan, pieces);
    if (!prog.ok()) return prog.status();
    AlignedBytes staging(prog->staging_bytes, 0), scratch(prog->scratch_bytes, 0xCD);
    if (staging.data == nullptr || scratch.data == nullptr) {
      return absl::ResourceExhaustedError("host program: cannot allocate its staging and scratch buffers");
    }
    PackStaging(*prog, staging.data);
    RunProgramOnHost(*prog, staging.data, scratch.data, dst.data(), launch_, stats_);
    return absl::OkStatus();
  }

 private:
  const HostLaunch launch_;
  ProgramStats* const stats_;
};

}  // namespace

void RunProgramOnHost(const AssemblyProgram& program, const std::byte* staging, std::byte* scratch, std::byte* slot,
                      const HostLaunch& launch, ProgramStats* stats) {
  HostBackend backend(launch);
  ProgramStats ignored;
  // Every host step succeeds; the status is the device backend's concern.
  (void)RunProgram(program, staging, scratch, slot, backend, stats != nullptr ? stats : &ignored);
}

std::unique_ptr<BatchAssembler> MakeHostProgramAssembler(const HostLaunch& launch, ProgramStats* stats) {
  return std::make_unique<HostProgramAssembler>(launch, stats);
}

}  // namespace conveyor::gpu
