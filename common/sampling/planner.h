// planner.h: decides which sequences form each minibatch, from the index alone (no parsing).
// This build's planner walks the file in order (randomize: false), CNTK's NoRandomizer:
//  - the timeline repeats the sweep (all sequences in file order) forever; epoch e covers
//    timeline samples [e*epochSize, (e+1)*epochSize) (epochSize defaults to one sweep) and
//    starts at the first sequence that starts at or after e*epochSize;
//  - a minibatch takes whole sequences while its sample count stays <= minibatchSize, and
//    always at least one; it is cut at the end of the epoch (checked before each sequence,
//    so the last one may overshoot) and at the end of a sweep.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/index/index.h"

namespace conveyor {

struct PlannedSequence {
  uint64_t chunk = 0;
  uint32_t index_in_chunk = 0;  // position among the chunk's index sequences
};

struct PlannedBatch {
  uint64_t epoch = 0;
  uint64_t batch = 0;  // 0-based within the epoch
  uint64_t planned_samples = 0;
  bool end_of_epoch = false;
  std::vector<PlannedSequence> sequences;
};

struct PlannerOptions {
  uint64_t minibatch_size = 256;     // samples, >= 1
  uint64_t epochs = 1;               // >= 1
  std::optional<uint64_t> epoch_size;  // samples; unset: one sweep
};

class FileOrderPlanner {
 public:
  // `index` must outlive the planner. Errors: InvalidArgument for a zero minibatch size.
  static absl::StatusOr<FileOrderPlanner> Create(const Index* index, const PlannerOptions& options);

  // The next minibatch, or std::nullopt after the last epoch.
  std::optional<PlannedBatch> Next();

 private:
  FileOrderPlanner(const Index* index, const PlannerOptions& options);
  void StartEpoch();

  const Index* index_;
  PlannerOptions options_;
  uint64_t epoch_size_ = 0;
  std::vector<uint64_t> start_;       // timeline start of each sequence within the sweep
  std::vector<uint64_t> chunk_of_;    // chunk of each sequence
  uint64_t epoch_ = 0;
  uint64_t batch_ = 0;
  uint64_t sweep_ = 0;
  uint64_t seq_ = 0;                  // next sequence within the sweep
  bool in_epoch_ = false;
};

}  // namespace conveyor
