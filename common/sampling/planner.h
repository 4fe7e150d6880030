// planner.h: decides, from the index alone (no parsing), which units (sequences, or frames
// in frame mode) form each minibatch of this rank, in CNTK's semantics:
//  - the timeline is the sweeps' delivery orders (sweep_order.h) one after the other;
//    epoch e covers timeline samples [e*epochSize, (e+1)*epochSize) (default: one sweep)
//    and starts at the first unit that starts at or after e*epochSize;
//  - a global minibatch takes whole units while it holds <= minibatchSize samples, and at
//    least one; it is cut at the end of the epoch (checked before each unit) and of a sweep;
//  - ranks split every global minibatch: all ranks walk the same global timeline, so every
//    rank gets the same number of minibatches and the ranks' data is disjoint and complete.
//    Balanced: the minibatch's units are dealt in order, each to the rank holding the fewest
//    samples so far (ties: the lowest rank). Chunks (CNTK's): rank r of w takes the units of
//    the chunks whose randomized position p has p % w == r (some batches may be empty);
//  - truncated BPTT: N slots (global; slot j belongs to rank j % w) each carry a queue of
//    sequences; every minibatch is T steps of each slot, a sequence continuing in the same
//    slot across minibatches.
// The state after each minibatch is a CursorState: planning is a pure function of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/index/index.h"
#include "common/sampling/sweep_order.h"

namespace conveyor {

struct PlannerOptions {
  uint64_t minibatch_size = 256;       // samples, >= 1 (global: all ranks together)
  uint64_t epochs = 1;                 // epochs to plan, counted from epoch 0
  std::optional<uint64_t> epoch_size;  // samples; unset: one sweep
  uint32_t rank = 0;
  uint32_t world = 1;
  RandomizerOptions randomizer;        // window resolved by the caller
  // minibatchMode full: the last minibatch of an epoch is filled up with the units that
  // follow (across the sweep end), and the next epoch starts after them; partial (default):
  // it ends with the epoch.
  bool full_minibatches = false;
  uint32_t truncation = 0;             // T > 0: truncated BPTT
  uint32_t parallel = 0;               // N slots; 0: max(1, minibatch_size / T)
  Distribution distribution = Distribution::kChunks;  // how ranks share a minibatch (not BPTT)
};

// Where the timeline stands: everything needed to continue exactly.
struct CursorState {
  uint64_t epoch = 0;
  uint64_t batch = 0;            // next minibatch index within the epoch
  uint64_t sweep = 0;
  uint64_t segment = 0;          // next unit: segment of `sweep` ...
  uint64_t offset = 0;           // ... and its index within that segment
  uint64_t sample_in_sweep = 0;  // timeline samples of `sweep` before the next unit
  struct Slot {                  // truncated BPTT: the sequence a slot is in, if any
    bool active = false;
    uint64_t sequence = 0;
    uint32_t offset = 0;         // steps of it already delivered
  };
  std::vector<Slot> slots;
  bool operator==(const CursorState& o) const;
};

// A piece of a unit placed in the batch: samples [sample_begin, sample_begin + count) of a
// sequence, at row `row`, time step `t0` onwards.
struct Piece {
  static constexpr uint32_t kAll = UINT32_MAX;
  uint64_t sequence = 0;     // index into Index::sequences
  uint32_t chunk = 0;
  uint32_t index_in_chunk = 0;
  uint32_t frame = Unit::kWholeSequence;  // frame mode: the frame
  uint32_t sample_begin = 0;
  uint32_t sample_count = kAll;  // kAll: the whole sequence (every stream's own length)
  uint32_t row = 0;
  uint32_t t0 = 0;
  bool begins = true;  // the piece starts its sequence
  bool ends = true;    // the piece ends its sequence
};

struct PlannedBatch {
  uint64_t epoch = 0;
  uint64_t batch = 0;
  bool end_of_epoch = false;
  bool end_of_sweep = false;
  uint64_t global_samples = 0;   // samples of the global minibatch (all ranks)
  uint32_t rows = 0;             // local rows: pieces (or local slots in BPTT)
  uint32_t steps = 0;            // BPTT: T; otherwise 0
  std::vector<Piece> pieces;     // this rank's
  CursorState after;             // continue from here to get the next minibatch
  // Chunks (ids) this plan can no longer need this sweep beyond the pieces already planned.
  std::vector<uint32_t> exhausted_chunks;
};

class Planner {
 public:
  // `index` must outlive the planner. Errors: InvalidArgument (zero sizes, rank >= world,
  // frame mode with truncation).
  static absl::StatusOr<std::unique_ptr<Planner>> Create(const Index* index, const PlannerOptions& options);

  // Continues from `state` (a decoded cursor). Errors: InvalidArgument when the state does
  // not fit the index (segment, offset or slots out of range).
  absl::Status Seek(const CursorState& state);
  // Seek() to a cursor's state from outside (a resume), which must also agree with itself and
  // with this stream: its epoch not past the last, its place on the timeline not before its
  // epoch's start and, but in truncated BPTT, no more batches before it in its epoch than samples.
  absl::Status Resume(const CursorState& state);

  // Starts at the first minibatch of epoch `epoch` (< options().epochs), from the start.
  // Positions directly (one sweep's units at most are counted) unless minibatches spill
  // across epochs (full minibatch mode, truncated BPTT): then the epochs before it are
  // planned and dropped, refused past kMaxReplayUnits units. Errors: InvalidArgument.
  absl::Status SeekEpoch(uint64_t epoch);
  static constexpr uint64_t kMaxReplayUnits = uint64_t{1} << 27;

  // Whether this rank may take units of the chunk at randomized position `position` (the
  // chunks worth parsing ahead): its own under the chunks distribution, any under balanced.
  bool MayUse(uint64_t position) const {
    return options_.distribution == Distribution::kBalanced || position % options_.world == options_.rank;
  }

  // The next minibatch of this rank, or std::nullopt after the last epoch.
  std::optional<PlannedBatch> Next();

  const PlannerOptions& options() const { return options_; }
  // Where planning stands: the next unit's sweep and segment.
  const CursorState& state() const { return state_; }
  // The last sweep any planned epoch reaches.
  uint64_t last_sweep() const;
  uint64_t sweep_samples() const { return index_->total_samples; }

 private:
  Planner(const Index* index, const PlannerOptions& options);
  // The unit at the stream's position, loading segments (and sweeps) as needed.
  const Unit* Peek();
  void Advance();
  uint64_t Position() const { return state_.sweep * index_->total_samples + state_.sample_in_sweep; }
  void OpenSweep(uint64_t sweep, uint64_t segment);
  void NoteExhausted(uint64_t up_to_segment, std::vector<uint32_t>* out);
  // Whether this rank takes `u`, the `unit`-th unit of the minibatch being planned. Inline:
  // the planner asks for every unit, and only the balanced distribution needs state.
  bool TakesUnit(const Unit& u, uint64_t unit) {
    if (options_.world == 1) return true;  // (no division per unit: the common case)
    if (options_.distribution == Distribution::kChunks) return u.position % options_.world == options_.rank;
    return TakesBalancedUnit(u, unit);
  }
  bool TakesBalancedUnit(const Unit& u, uint64_t unit);
  std::optional<PlannedBatch> NextFrameOrSequence();
  std::optional<PlannedBatch> NextTruncated();
  // Moves the state past the batch just planned (next batch, or next epoch) into b->after.
  void Step(PlannedBatch* b);

  const Index* const index_;
  const PlannerOptions options_;
  uint64_t epoch_size_ = 0;
  uint32_t slots_ = 0;
  CursorState state_;
  std::unique_ptr<SweepOrder> order_;
  uint64_t order_sweep_ = UINT64_MAX;
  const HugeVector<Unit>* segment_ = nullptr;
  // Balanced distribution: the samples each rank holds in the minibatch being planned, once
  // every rank has a unit (a min-heap of (samples, rank)).
  std::vector<std::pair<uint64_t, uint32_t>> rank_loads_;
  uint64_t loaded_segment_ = UINT64_MAX;
  std::vector<uint64_t> last_segment_;   // per randomized position: last segment it feeds
  uint64_t exhausted_upto_ = 0;          // positions with last_segment_ < this are reported
  std::vector<uint32_t> pending_exhausted_;
  std::vector<uint32_t> deferred_exhausted_;  // BPTT: exhausted, but a slot still reads it
  std::vector<uint32_t> chunk_of_sequence_;  // sequence -> chunk (BPTT slots resume by sequence)
};

}  // namespace conveyor
