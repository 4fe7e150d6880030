// loader.h: the whole local read path of one stream of minibatches: planner -> parser
// threads (ChunkPipeline) -> assembler -> a batch in a reusable 256-byte-aligned buffer.
// `conveyor dump` and `conveyor bench` run it; the daemon will run one per subscription.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/assembler.h"
#include "common/batch/batch_layout.h"
#include "common/dataset/dataset.h"
#include "common/sampling/chunk_pipeline.h"
#include "common/sampling/planner.h"

namespace conveyor {

struct LoaderOptions {
  PlannerOptions planner;
  int threads = 1;   // parser threads
  int prefetch = 0;  // chunks parsed ahead; 0: 2 per thread
};

// One assembled batch. `bytes` is valid until the next call to Loader::Next().
struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  bool end_of_epoch = false;
  BatchPlan plan;
  absl::Span<const std::byte> bytes;
};

class Loader {
 public:
  // `dataset` and `assembler` must outlive the loader. Errors: InvalidArgument (options).
  static absl::StatusOr<std::unique_ptr<Loader>> Create(const Dataset* dataset,
                                                        BatchAssembler* assembler,
                                                        const LoaderOptions& options);
  ~Loader();

  // Assembles the next batch into `out`; returns false after the last one. Errors: parse
  // errors beyond maxErrors (DataLoss), assembly errors. Batches whose every sequence was
  // dropped as bad are skipped.
  absl::StatusOr<bool> Next(Batch* out);

  const ChunkPipeline& pipeline() const { return *pipeline_; }

 private:
  struct Planned {
    PlannedBatch batch;
    std::vector<uint64_t> tickets;  // per sequence
  };
  Loader(const Dataset* dataset, BatchAssembler* assembler, FileOrderPlanner planner,
         const LoaderOptions& options);
  // Plans ahead so that the pipeline has enough chunks scheduled.
  void PlanAhead();
  void Retire(const Planned& p);

  const Dataset* const dataset_;
  BatchAssembler* const assembler_;
  FileOrderPlanner planner_;
  std::unique_ptr<ChunkPipeline> pipeline_;
  uint64_t lookahead_chunks_;
  std::deque<Planned> planned_;
  bool planner_done_ = false;
  std::optional<uint64_t> open_chunk_;
  uint64_t open_ticket_ = 0;
  std::map<uint64_t, uint64_t> ticket_refs_;  // ticket -> planned batches using it
  uint64_t scheduled_ahead_ = 0;
  bool fetched_any_ = false;
  uint64_t last_fetched_ = 0;
  std::byte* buffer_ = nullptr;
  size_t buffer_size_ = 0;
};

}  // namespace conveyor
