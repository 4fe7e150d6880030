// wire.h: conversions between conveyor's in-memory batch plan and the protocol's batch
// descriptor (both directions), shared by the daemon and the clients.
#pragma once

#include "absl/status/statusor.h"
#include "common/batch/batch_layout.h"
#include "common/config/dataset_config.h"
#include "common/sampling/stream_request.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor {

// Fills the layout part of `out` (arrays, streams, pieces, shape) from `plan`.
void PlanToDescriptor(const BatchPlan& plan, v1::BatchDescriptor* out);

// The plan a descriptor describes, checked against `total_bytes` of payload: every array
// must lie inside the batch and every piece inside its arrays. Errors: InvalidArgument
// naming what does not fit (a client must never read out of bounds because a server lied).
absl::StatusOr<BatchPlan> DescriptorToPlan(const v1::BatchDescriptor& d);

v1::Format ToProto(StreamFormat f);
v1::DType ToProto(DType t);
v1::Layout ToProto(OutputLayout l);
// Errors: InvalidArgument for a value this version does not know.
absl::StatusOr<OutputLayout> LayoutFromProto(v1::Layout l);

// The Subscribe message for `request` (what the CLI's stream flags ask for) on `dataset`.
// Credits and transport are left to the caller.
v1::Subscribe MakeSubscribe(const std::string& dataset, const StreamRequest& request);

}  // namespace conveyor
