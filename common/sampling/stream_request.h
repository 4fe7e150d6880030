// stream_request.h: turns what a reader asks for (CLI flags today, a subscription
// tomorrow) plus the dataset's configuration into loader options, and checks a resume
// cursor against them. Flags override the configuration; a cursor fixes the seed, and its
// rank/world unless the request names a world (an elastic resume: the rest of the epoch is
// re-partitioned over the new world, every remaining unit delivered exactly once).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/dataset/dataset.h"
#include "common/sampling/cursor.h"
#include "common/sampling/loader.h"

namespace conveyor {

struct StreamRequest {
  std::optional<bool> randomize;
  std::optional<uint64_t> seed;
  uint64_t minibatch_size = 256;
  uint64_t epochs = 1;
  std::optional<uint64_t> epoch_size;
  std::optional<uint32_t> rank;
  std::optional<uint32_t> world;
  std::optional<bool> frame_mode;
  std::optional<bool> full_minibatches;  // minibatchMode full
  uint32_t truncation = 0;  // 0: the configuration's (truncated + truncationLength)
  uint32_t parallel = 0;
  std::string resume;       // a cursor token, or empty
  int threads = 1;
  std::map<std::string, OutputLayout> layouts;  // by stream name; missing: native
  std::map<std::string, DType> value_dtypes;    // by stream name: float16 or bfloat16
  std::optional<Distribution> distribution;     // default: the dataset's
  std::optional<uint64_t> first_epoch;          // start at this epoch's first batch (no cursor)
  uint32_t batch_stride = 1, batch_offset = 0;  // deliver batches k with k % stride == offset
};

// Limits on what a request may ask for.
inline constexpr uint64_t kMaxMinibatchSize = 1ull << 24;
inline constexpr uint64_t kMaxEpochs = 1ull << 32;
inline constexpr uint32_t kMaxWorld = 1u << 16;
inline constexpr uint32_t kMaxParallel = 1u << 16;
inline constexpr uint32_t kMaxBatchStride = 1024;  // DataLoader workers sharing a stream

struct ResolvedStream {
  LoaderOptions loader;
  Cursor identity;  // data/config hashes, seed, rank, world: what cursors of this stream carry
  std::vector<std::string> warnings;  // for the reader's log (e.g. ranks the chunks would starve)
  std::string Encode(const CursorState& after) const;
};

// Errors: InvalidArgument for out-of-range values, contradictions (frame mode with
// truncation, rank >= world), a corrupt cursor, or a cursor made for another dataset,
// configuration or seed.
absl::StatusOr<ResolvedStream> ResolveStream(const Dataset& dataset, const StreamRequest& request);

}  // namespace conveyor
