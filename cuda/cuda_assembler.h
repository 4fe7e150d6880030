// cuda_assembler.h: the CUDA BatchAssembler. The host builds an AssemblyProgram
// (assembly_program.h) and packs it into one of two pinned staging buffers; one H2D copy
// sends it; the program's kernels (cuda/kernels/, run in program_runner.h's order) zero the
// slot, copy dense values/ids/lengths/mask/flags, scan per-column nnz into colptr (Thrust),
// scatter CSC pieces, sum sparse samples into dense columns, decode Kaldi compressed
// matrices and transpose CSR streams (a stable radix sort). Everything runs on the
// assembler's own stream; while the device assembles batch k the host packs batch k+1 into
// the other staging buffer (an event guards each buffer's reuse). The same kernels run on
// the host in CI (host_program.h), byte for byte the CPU assembler's batches; on a device,
// conveyor_gpu_tests compares them too.
//
// Each call makes the assembler's device current on the calling thread first (and leaves
// it current); destruction may happen on any thread. Not thread-safe: one producer at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/batch/assembler.h"
#include "cuda/assembly_program.h"

namespace conveyor::gpu {

struct CudaAssemblerOptions {
  int device = 0;
  // Initial size of each of the two pinned staging buffers and their device mirrors; a
  // larger batch grows them (once, logged), so steady state never allocates.
  uint64_t staging_bytes = uint64_t{32} << 20;
  // Initial size of the buffer Thrust's scans take their temporary storage from; a larger
  // request is served by a stream-ordered allocation once and grows the buffer (tests set 0
  // to exercise that path).
  uint64_t scan_buffer_bytes = uint64_t{1} << 20;
};

// How batches bound for host memory came back (CudaAssembler::downloads()).
struct DownloadStats {
  uint64_t direct = 0;   // by DMA straight into page-locked destinations
  uint64_t staged = 0;   // into a pinned buffer, then copied on by the host (pageable destinations)
  uint64_t buffers = 0;  // device/pinned buffer pairs made: the most batches in flight at once
};

class CudaAssembler final : public BatchAssembler {
 public:
  // Errors: Unimplemented (no CUDA backend in this build), FailedPrecondition (no such
  // device), Internal (a CUDA call failed: file, line, call, error). A call that fails after
  // enqueuing work waits for the device first: nothing writes the destination afterwards.
  static absl::StatusOr<std::unique_ptr<CudaAssembler>> Create(const CudaAssemblerOptions& options);
  ~CudaAssembler() override;

  const char* name() const override { return "cuda"; }
  // `dst` may be device memory (assembled in place) or host memory (assembled in device
  // memory, then copied back: see Begin()). Returns when the batch is complete.
  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) override;
  // Enqueues the batch into device memory `device_dst` (plan.total_bytes bytes) and returns
  // once the host's part is done; the pieces' chunks may be released then. Synchronize()
  // (or a later Assemble) waits for the device.
  absl::Status AssembleAsync(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* device_dst);
  // The pipelined form (BatchAssembler): into device memory, Begin() returns once the host's
  // part is done (the pieces' chunks are no longer read), and Wait() waits for an event
  // recorded after the batch. Into host memory, the batch is assembled in a device buffer of
  // the assembler's and copied back on a second stream, so that the next batch's assembly
  // overlaps this copy; Begin() returns once the host's part is done, Wait() once the bytes
  // are in `dst`. Page-locked destinations (cudaHostAlloc'd, or registered: RegisterHostMemory
  // in slot_pool.h) are written by DMA directly; pageable ones through a pinned buffer that
  // Wait() copies from (one pass more on the host).
  absl::StatusOr<uint64_t> Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                 absl::Span<std::byte> dst) override;
  absl::Status Wait(uint64_t fence) override;
  bool pipelined() const override { return true; }
  // Waits for the assembler's stream: batches into device memory are complete (batches into
  // host memory need their Wait(), which also waits for their copy back).
  absl::Status Synchronize();
  int device() const;
  // What the programs run so far enqueued (descriptors, launches); scans whose temporary
  // storage did not fit the scan buffer.
  ProgramStats stats() const;
  uint64_t scan_buffer_fallbacks() const;
  DownloadStats downloads() const;
  // Tests: enqueues a kernel that keeps the assembler's stream busy for about `duration`, so
  // that the host runs ahead of the device (staging reuse must then wait).
  absl::Status StallForTesting(absl::Duration duration);

 private:
  struct Impl;
  explicit CudaAssembler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::gpu
