// loader.h: the whole local read path of one stream of minibatches: planner -> parser
// threads (ChunkPipeline, parsing chunks in the order the plan first needs them and
// dropping them once the plan has moved past them) -> assembler -> a batch in a reusable
// 256-byte-aligned buffer. `conveyor dump` and `conveyor bench` run it; the daemon will run
// one per subscription. Only the chunks of the randomization window (plus the prefetch)
// are parsed and resident at any time, unless keepDataInMemory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
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
  std::optional<CursorState> resume;  // continue after the batch this state follows
  std::vector<OutputLayout> layouts;  // per stream (empty: all native)
  ParserPool* pool = nullptr;         // shared parser threads (nullptr: the loader's own)
};

// One assembled batch. `bytes` is valid until the next call to Loader::Next().
struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  bool end_of_epoch = false;
  bool end_of_sweep = false;
  BatchPlan plan;      // may have no rows: an empty local minibatch (other ranks' data)
  absl::Span<const std::byte> bytes;
  CursorState after;   // resume here to continue after this batch
};

// Where a caller wants a batch of `bytes` bytes assembled (a shared-memory slot, a message
// buffer): memory that stays valid until the caller is done with the batch.
using BatchDestination = std::function<absl::StatusOr<absl::Span<std::byte>>(uint64_t bytes)>;

class Loader {
 public:
  // `dataset` and `assembler` must outlive the loader. Errors: InvalidArgument (options,
  // a resume state that does not fit the dataset).
  static absl::StatusOr<std::unique_ptr<Loader>> Create(const Dataset* dataset,
                                                        BatchAssembler* assembler,
                                                        const LoaderOptions& options);
  ~Loader();

  // Assembles the next batch into `out`; returns false after the last one. Errors: parse
  // errors beyond maxErrors (DataLoss), assembly errors (InvalidArgument). A sequence
  // dropped as bad leaves its batch smaller; batches are never skipped, so every rank sees
  // the same number of them.
  // With `destination`, the batch is assembled straight into the memory it returns (saving
  // a copy) and `out->bytes` points there; its errors are returned as they are.
  absl::StatusOr<bool> Next(Batch* out, const BatchDestination& destination = nullptr);

  const ChunkPipeline& pipeline() const { return *pipeline_; }
  // Chunks currently scheduled or held (for memory tests).
  size_t open_chunks() const { return open_.size() + closed_.size(); }

 private:
  struct Planned {
    PlannedBatch batch;
    std::vector<uint64_t> tickets;  // per piece
    std::vector<uint64_t> distinct;  // the tickets above, each once (sorted)
  };
  Loader(const Dataset* dataset, BatchAssembler* assembler, std::unique_ptr<Planner> planner,
         const LoaderOptions& options);
  void PlanAhead();
  // Schedules the chunks of the next randomized positions before any batch needs them.
  void PrefetchAhead();
  void Unref(uint64_t ticket);

  const Dataset* const dataset_;
  BatchAssembler* const assembler_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<ChunkPipeline> pipeline_;
  const bool bptt_;
  const std::vector<OutputLayout> layouts_;
  uint64_t lookahead_chunks_;
  std::deque<Planned> planned_;
  bool planner_done_ = false;
  std::map<uint32_t, uint64_t> open_;       // chunk id -> ticket the plan may still add to
  std::set<uint64_t> closed_;               // tickets the plan is done with, still referenced
  std::map<uint64_t, uint64_t> ticket_refs_;  // ticket -> planned batches using it
  uint64_t scheduled_ahead_ = 0;
  uint64_t prefetch_sweep_ = 0, prefetch_pos_ = 0;  // next randomized position to schedule
  bool prefetch_started_ = false;
  std::vector<uint32_t> prefetch_order_;           // chunk order of prefetch_sweep_
  std::set<uint64_t> fetched_;  // tickets taken from the pipeline at least once
  std::byte* buffer_ = nullptr;
  size_t buffer_size_ = 0;
};

}  // namespace conveyor
