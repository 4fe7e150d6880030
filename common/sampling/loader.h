// loader.h: the whole local read path of one stream of minibatches: planner -> parser
// threads (ChunkPipeline, parsing chunks in the order the plan first needs them and
// dropping them once the plan has moved past them) -> assembler -> a batch in a reusable
// 256-byte-aligned buffer. `conveyor dump` and `conveyor bench` run it; the daemon will run
// one per subscription. Only the chunks of the randomization window (plus the prefetch)
// are parsed and resident at any time, unless keepDataInMemory.
#pragma once

#include <atomic>
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
  // Threads that parse. With a pool of its own (`pool` null), the caller's thread is one of
  // them: `threads` - 1 pool threads parse ahead and help assemble, and the caller parses
  // what it would otherwise wait for, so the loader uses `threads` cores at most (1: the
  // caller alone plans, parses and assembles). With a shared pool, the chunks it parses at
  // once, on the pool's threads.
  int threads = 1;
  int prefetch = 0;  // chunks parsed ahead; 0: 2 per thread
  std::optional<CursorState> resume;  // continue after the batch this state follows
  std::vector<OutputLayout> layouts;  // per stream (empty: all native)
  std::vector<DType> value_dtypes;    // per stream (empty: all native): float16/bfloat16 narrowing
  // Batches of the stream this loader delivers: those whose index k (counted from where it
  // starts) has k % batch_stride == batch_offset. The others are planned (their cursors and
  // chunk releases kept exact) but neither parsed for nor assembled: DataLoader workers
  // sharing one trainer's stream.
  uint32_t batch_stride = 1;
  uint32_t batch_offset = 0;
  // Start at the first batch of this epoch (without `resume`).
  uint64_t first_epoch = 0;
  ParserPool* pool = nullptr;         // shared parser threads (nullptr: the loader's own)
  // A batch of at least twice this many pieces is planned in ranges on the parser threads
  // free to help (PlanThreads) when the assembler splits batches like the one before
  // (BatchAssembler::SplitsBatchesOf); tests lower it to split the smallest.
  size_t min_plan_range_pieces = kMinPiecesPerPlanRange;
  // Asked before each chunk is parsed (ChunkPipelineOptions::admit); empty: always.
  std::function<absl::Status(uint64_t chunk_id)> admit_chunk;
};

// One assembled batch. `bytes` is valid until the next call to Loader::Next().
struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  bool end_of_epoch = false;
  bool end_of_sweep = false;
  BatchPlan plan;      // may have no rows: an empty local minibatch (other ranks' data)
  // Pieces of this batch's plan left out because their sequence was dropped as bad input
  // (maxErrors): so many rows fewer (gaps in truncated BPTT).
  uint32_t dropped = 0;
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

  // The pipelined form of Next(): Begin() plans the next batch and starts assembling it
  // into `destination`'s memory (returns false after the last batch, beginning nothing);
  // Complete() waits for the oldest batch begun and fills `out`. With a pipelined or
  // device assembler, planning batch k+1 overlaps assembling batch k:
  //   Begin(d); while (Begin(d)) { Complete(&b); use(b); }  Complete(&b); use(b);
  // Chunks stay held until their batch completes. Errors as Next(); after an error from
  // Begin(), the batches begun before it can still be completed.
  // What `out` held before (Next() and Complete() replace it) is taken back: a caller that
  // passes the same Batch every time lets the next batch's plan reuse its arrays.
  absl::StatusOr<bool> Begin(const BatchDestination& destination);
  absl::Status Complete(Batch* out);
  size_t in_flight() const { return in_flight_.size(); }
  // True when Begin() returns before its batch is assembled (a device, or the CPU assembler
  // with parser threads helping): only then does a second batch in flight gain anything.
  bool pipelined() const { return assembler_->pipelined(); }

  // Stops the loader from any thread: a Next() or Begin() waiting for a chunk returns
  // Cancelled at once, and so does every later one (Complete() still completes batches
  // begun). Planning checks it between minibatches, and no call plans or prefetches more
  // than O(chunks + window) without checking it.
  void Cancel();

  const ChunkPipeline& pipeline() const { return *pipeline_; }
  // Chunks currently scheduled or held (for memory tests).
  size_t open_chunks() const { return open_.size() + closed_.size(); }

 private:
  struct Planned {
    PlannedBatch batch;
    std::vector<uint64_t> distinct;     // the tickets of its chunks, in the order pieces first use them
    std::vector<uint32_t> piece_chunk;  // per piece: its chunk's place in `distinct`
  };
  struct InFlight {  // a batch begun: what its assembly reads until it completes
    Batch batch;      // all but `bytes`
    std::vector<PieceRef> refs;
    std::vector<std::shared_ptr<const ParsedChunk>> held;  // its chunks
    std::vector<uint64_t> used;  // distinct tickets, unreferenced at completion
    absl::Span<std::byte> dst;
    uint64_t fence = 0;
  };
  Loader(const Dataset* dataset, BatchAssembler* assembler, std::unique_ptr<Planner> planner,
         const LoaderOptions& options);
  void PlanAhead();
  // The plan is done with these chunks (a batch's exhausted_chunks): release them when no
  // planned batch holds them.
  void CloseChunks(const std::vector<uint32_t>& chunks);
  // Schedules the chunks of the next randomized positions before any batch needs them.
  void PrefetchAhead();
  void Unref(uint64_t ticket);

  const Dataset* const dataset_;
  BatchAssembler* const assembler_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<ChunkPipeline> pipeline_;
  const bool bptt_;
  const std::vector<OutputLayout> layouts_;
  const std::vector<DType> value_dtypes_;
  const uint32_t batch_stride_, batch_offset_;
  const size_t min_plan_range_pieces_;
  uint64_t last_plan_bytes_ = 0;  // of the batch planned last
  uint64_t batches_planned_ = 0;  // of the whole stream, ours or not
  // Pieces planned ahead of the consumer, at most (beyond the one batch always planned).
  static constexpr size_t kMaxPiecesAhead = size_t{1} << 20;
  uint64_t lookahead_chunks_;
  std::atomic<bool> cancelled_{false};
  std::deque<Planned> planned_;
  size_t planned_pieces_ = 0;
  bool planner_done_ = false;
  std::map<uint32_t, uint64_t> open_;       // chunk id -> ticket the plan may still add to
  std::set<uint64_t> closed_;               // tickets the plan is done with, still referenced
  std::map<uint64_t, uint64_t> ticket_refs_;  // ticket -> planned batches using it
  // Per chunk id: the last batch planned that uses it (batches_planned_ then) and the chunk's
  // place in that batch's `distinct`: a randomized batch changes chunk at nearly every piece.
  struct ChunkMark {
    uint64_t batch = 0;
    uint32_t place = 0;
  };
  std::vector<ChunkMark> marks_;
  uint64_t scheduled_ahead_ = 0;
  uint64_t prefetch_sweep_ = 0, prefetch_pos_ = 0;  // next randomized position to schedule
  bool prefetch_started_ = false;
  std::vector<uint32_t> prefetch_order_;           // chunk order of prefetch_sweep_
  std::set<uint64_t> fetched_;  // tickets taken from the pipeline at least once
  std::deque<std::unique_ptr<InFlight>> in_flight_;  // begun, oldest first
  std::byte* buffer_ = nullptr;
  size_t buffer_size_ = 0;
  // The plan of a batch the caller has handed back (Complete() swaps it out of its Batch):
  // the next PlanBatch() reuses its arrays and its pieces' name strings.
  BatchPlan spare_plan_;
};

// Reads `loader` to its end with up to `depth` batches in flight (Begin() ahead, Complete()
// oldest first), calling `each` with every batch in order; `each` is where the caller gives
// back the batch's destination memory. Stops at the first error (the loader's or `each`'s).
absl::Status RunPipelined(Loader* loader, size_t depth, const BatchDestination& destination,
                          const std::function<absl::Status(const Batch&)>& each);

// RunPipelined into buffers of its own (256-byte aligned, used in turn; a batch's bytes are
// valid while `each` runs): two batches in flight when the loader is pipelined(), else one.
absl::Status RunWithOwnBuffers(Loader* loader, const std::function<absl::Status(const Batch&)>& each);

}  // namespace conveyor
