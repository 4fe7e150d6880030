// assembler.h: the interface every batch assembler implements (the CPU reference here, the
// CUDA one in cuda/). An assembler writes the batch described by a BatchPlan into memory
// it is given; it never allocates the destination. Implementations must agree byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/batch_layout.h"

namespace conveyor {

// Threads an assembler may borrow to split one batch's work (ranges of a stream's pieces)
// without changing a byte of it: the loader lends its parser pool, whose threads help when
// they have no chunk to parse, so the pool stays the bound on CPU. Thread-safe.
class AssemblyHelpers {
 public:
  virtual ~AssemblyHelpers() = default;
  // Threads idle now: the helpers worth asking for work that is joined at once.
  virtual int idle() const = 0;
  // Threads that may take ranges of a batch joined later (Begin(), then Wait()): the idle
  // ones, or more (parser_pool.h: those busy only assembling, or all where cores are spare).
  // A helper that is busy takes its ranges when it gets to them; whoever waits for the batch
  // runs the ranges still untaken, so a busy helper never delays a batch.
  virtual int available() const { return idle(); }
  // Runs `job` (a share of a batch's assembly) on one of the threads, after the jobs
  // submitted before it.
  virtual void Help(std::function<void()> job) = 0;
};

// Runs task(0..n-1) on the calling thread and on up to `helper_jobs` jobs handed to
// `helpers` (null: the calling thread alone), each thread taking the next task left; returns
// when every task has returned. A job that starts after that finds nothing left to run, so a
// busy helper never delays the caller.
void RunWithHelpers(AssemblyHelpers* helpers, int helper_jobs, size_t n, const std::function<void(size_t)>& task);

class BatchAssembler {
 public:
  virtual ~BatchAssembler() = default;
  // "cpu", "cuda", ...
  virtual const char* name() const = 0;
  // Writes the batch into `dst`, which must hold plan.total_bytes bytes and stay valid until
  // the call returns. `pieces` must be the ones `plan` was made from. Errors:
  // InvalidArgument (destination too small), Unimplemented (a backend not built), Internal.
  virtual absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                absl::Span<std::byte> dst) = 0;

  // The pipelined form: starts the batch and returns a fence for Wait(), so that the caller
  // can plan the next batch while this one is assembled (by a worker thread, or by the
  // device while the host packs the next). `plan`, `pieces`, the chunks they point into and
  // `dst` must stay valid and unchanged until Wait(fence) returns. Fences increase; Wait()
  // must be called for every fence, in order. The default assembles at once.
  virtual absl::StatusOr<uint64_t> Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                         absl::Span<std::byte> dst) {
    absl::Status st = Assemble(plan, pieces, dst);
    if (!st.ok()) return st;
    return ++assembled_;
  }
  // True when Begin() returns before the batch is written (a worker thread, a device): only
  // then is there anything to gain from beginning the next batch before completing this one.
  virtual bool pipelined() const { return false; }
  // Returns when batch `fence` is complete, with its error if assembling it failed.
  virtual absl::Status Wait(uint64_t fence) {
    (void)fence;
    return absl::OkStatus();
  }
  // Threads this assembler may borrow to split a batch (nullptr: none; the default ignores
  // them). The Loader sets its parser pool here while it uses the assembler and clears it
  // when it goes: an assembler serves one Loader at a time. `helpers` must outlive that use.
  virtual void set_helpers(AssemblyHelpers* helpers) { (void)helpers; }
  // Whether a batch of `bytes` is assembled in ranges on the helpers (set_helpers): the
  // Loader then places such a batch's pieces on them too (PlanThreads), since the threads
  // that place a range read it back when they assemble.
  virtual bool SplitsBatchesOf(uint64_t bytes) const {
    (void)bytes;
    return false;
  }

 private:
  uint64_t assembled_ = 0;
};

// InvalidArgument unless a slot of `slot_bytes` holds the batch of `plan` (every assembler's
// first check).
absl::Status CheckSlotSize(const BatchPlan& plan, size_t slot_bytes);

// The CPU reference assembler. Assemble(), Begin() and Wait() from one thread at a time.
// With helpers (set_helpers) and some of them idle, a batch's streams are cut into ranges of
// pieces, each writing bytes no other range writes, so the output is the same for any number
// of threads; Begin() then hands the ranges to the helpers and returns (pipelined() is true),
// and Wait() takes the ranges no helper has started yet onto the calling thread.
struct CpuAssemblerOptions {
  // Batches smaller than this are assembled on the calling thread alone.
  uint64_t min_parallel_bytes = 512 << 10;
  // About this many bytes of a stream's output a range (a task for one thread).
  uint64_t range_bytes = 256 << 10;
  // Helpers used at most, besides the calling thread.
  int max_helpers = 64;
};
std::unique_ptr<BatchAssembler> MakeCpuAssembler(const CpuAssemblerOptions& options = {});

// Runs `inner`'s Assemble() on a worker thread of its own, in the order begun: Begin()
// returns at once, Wait() blocks until that batch is written. For the CPU assembler, this
// overlaps planning the next batch with copying this one.
std::unique_ptr<BatchAssembler> MakePipelinedAssembler(std::unique_ptr<BatchAssembler> inner);

}  // namespace conveyor
