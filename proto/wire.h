// wire.h: conversions between conveyor's in-memory batch plan and the protocol's batch
// descriptor (both directions), shared by the daemon and the clients. The Subscribe <->
// StreamRequest mapping is in subscribe.h, the status conversions in status.h.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/batch_layout.h"
#include "common/config/dataset_config.h"
#include "common/sampling/stream_request.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor {

// Fills the layout part of `out` (arrays, streams, pieces, shape) from `plan`. `compact`
// (the subscriber set Subscribe.compact_pieces): pieces that are one sample of each stream
// alone in their rows are described by Pieces.single_sample_rows and their keys only.
void PlanToDescriptor(const BatchPlan& plan, v1::BatchDescriptor* out, bool compact = false);

struct Batch;  // common/sampling/loader.h
// The message announcing `batch` as batch `serial` of a stream, resumable at `cursor`: its
// descriptor complete but for where its bytes are, which its transport adds. `compact`: as
// PlanToDescriptor's.
v1::StreamResponse BatchResponse(const Batch& batch, uint64_t serial, const std::string& cursor,
                                 bool compact = false);

// Streams a batch descriptor may have.
inline constexpr int kMaxStreams = 4096;
// Pieces x streams a compact descriptor (Pieces.single_sample_rows) may imply: a client
// allocates them without the daemon having sent them (a frame-mode minibatch of 2^24
// samples in 4 streams fits; the daemon sends larger ones in full).
inline constexpr uint64_t kMaxImpliedCounts = uint64_t{1} << 26;

// The plan a descriptor describes, checked against `total_bytes` of payload: every enum
// known, every array inside the batch with the dtype and shape its stream's layout implies,
// every piece inside its row (a compact descriptor's pieces as Pieces.single_sample_rows
// implies them). Errors: InvalidArgument naming what does not fit (a client
// must never read out of bounds because a server lied). Does not allocate beyond the plan.
absl::StatusOr<BatchPlan> DescriptorToPlan(const v1::BatchDescriptor& d);

// Checks the contents a reader indexes with, for host bytes laid out by `plan` (which
// DescriptorToPlan made): `bytes` has total_bytes, every length is at most T, CSC/CSR
// pointers rise from 0 to nnz and indices stay inside the matrix. After it, the typed views
// and the dump writer read only inside the batch. Errors: InvalidArgument naming the stream.
absl::Status ValidateBatchBytes(const BatchPlan& plan, absl::Span<const std::byte> bytes);

v1::Format ToProto(StreamFormat f);
v1::DType ToProto(DType t);
v1::Layout ToProto(OutputLayout l);
// Errors: InvalidArgument for a value this version does not know.
absl::StatusOr<OutputLayout> LayoutFromProto(v1::Layout l);

}  // namespace conveyor
