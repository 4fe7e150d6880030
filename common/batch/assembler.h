// assembler.h: the interface every batch assembler implements (the CPU reference here, the
// CUDA one in cuda/). An assembler writes the batch described by a BatchPlan into memory
// it is given; it never allocates the destination. Implementations must agree byte for byte.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
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
};

// InvalidArgument unless a slot of `slot_bytes` holds the batch of `plan` (every assembler's
// first check).
absl::Status CheckSlotSize(const BatchPlan& plan, size_t slot_bytes);

// The CPU reference assembler. Stateless and thread-safe.
std::unique_ptr<BatchAssembler> MakeCpuAssembler();

}  // namespace conveyor
