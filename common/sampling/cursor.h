// cursor.h: the resume token. A cursor names a position in a stream of minibatches and
// everything the position depends on, so that any process (any daemon) holding the same
// dataset can continue the stream exactly:
//   version, data hash (the index: every sequence's key, offset, size and samples),
//   config hash (streams, precision, chunking, randomization, minibatch and epoch sizes,
//   frame mode, BPTT), seed, rank, world, and the CursorState after the last batch.
// Encoding: varints, a 32-bit check, URL-safe base64 without padding, prefixed "cv1.".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/index/index.h"
#include "common/sampling/planner.h"

namespace conveyor {

struct Cursor {
  uint64_t data_hash = 0;
  uint64_t config_hash = 0;
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t world = 1;
  CursorState state;
};

std::string EncodeCursor(const Cursor& cursor);

// Errors: InvalidArgument "cursor ...: <why>" for a token that is not a conveyor cursor,
// is of another version, or fails its check (corrupt or truncated).
absl::StatusOr<Cursor> DecodeCursor(std::string_view token);

// What a cursor must match to be resumed against a dataset.
uint64_t IndexHash(const Index& index);
uint64_t StreamConfigHash(const DatasetConfig& dataset, const PlannerOptions& options);

}  // namespace conveyor
