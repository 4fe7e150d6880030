// assembler.h: the interface every batch assembler implements (the CPU reference here, the
// CUDA one in cuda/). An assembler writes the batch described by a BatchPlan into memory
// it is given; it never allocates the destination. Implementations must agree byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/batch_layout.h"

namespace conveyor {

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

 private:
  uint64_t assembled_ = 0;
};

// InvalidArgument unless a slot of `slot_bytes` holds the batch of `plan` (every assembler's
// first check).
absl::Status CheckSlotSize(const BatchPlan& plan, size_t slot_bytes);

// The CPU reference assembler. Stateless and thread-safe (Assemble(); Begin() is not).
std::unique_ptr<BatchAssembler> MakeCpuAssembler();

// Runs `inner`'s Assemble() on a worker thread of its own, in the order begun: Begin()
// returns at once, Wait() blocks until that batch is written. For the CPU assembler, this
// overlaps planning the next batch with copying this one.
std::unique_ptr<BatchAssembler> MakePipelinedAssembler(std::unique_ptr<BatchAssembler> inner);

}  // namespace conveyor
