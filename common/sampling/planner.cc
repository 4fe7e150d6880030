#include "common/sampling/planner.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// a * b, or UINT64_MAX when it does not fit: timeline positions are sample counts, and a
// request may ask for epochs of nearly 2^64 samples.
uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return p > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(p);
}

// Whether a BPTT slot is still in a sequence.
bool AnySlotActive(const std::vector<CursorState::Slot>& slots) {
  bool active = false;
  for (const auto& slot : slots) active = active || slot.active;
  return active;
}

// BPTT: the next `take` steps of the sequence in `slot`, at `row` from step `t0`.
Piece SlotPiece(const Index& index, uint32_t chunk, const CursorState::Slot& slot, uint32_t take, uint32_t row,
                uint32_t t0) {
  const uint32_t len = index.sequences[slot.sequence].num_samples;
  Piece p;
  p.sequence = slot.sequence;
  p.chunk = chunk;
  p.index_in_chunk = static_cast<uint32_t>(slot.sequence - index.chunks[p.chunk].first_sequence);
  p.sample_begin = slot.offset;
  p.sample_count = take;
  p.row = row;
  p.t0 = t0;
  p.begins = slot.offset == 0;
  p.ends = slot.offset + take == len;
  return p;
}

// BPTT: moves the chunks of *deferred that no active slot still reads to *released; the rest
// stay deferred. A chunk whose sequence is still in a slot stays needed until that sequence ends.
void ReleaseUnheldChunks(const std::vector<CursorState::Slot>& slots, const std::vector<uint32_t>& chunk_of_sequence,
                         std::vector<uint32_t>* deferred, std::vector<uint32_t>* released) {
  std::vector<uint32_t> still;
  for (uint32_t c : *deferred) {
    bool held = false;
    for (const auto& slot : slots) held = held || (slot.active && chunk_of_sequence[slot.sequence] == c);
    (held ? still : *released).push_back(c);
  }
  deferred->swap(still);
}

}  // namespace

bool CursorState::operator==(const CursorState& o) const {
  if (epoch != o.epoch || batch != o.batch || sweep != o.sweep || segment != o.segment ||
      offset != o.offset || sample_in_sweep != o.sample_in_sweep || slots.size() != o.slots.size())
    return false;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].active != o.slots[i].active) return false;
    if (slots[i].active && (slots[i].sequence != o.slots[i].sequence || slots[i].offset != o.slots[i].offset))
      return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(const Index* index, const PlannerOptions& options) {
  if (options.minibatch_size == 0) return absl::InvalidArgumentError("minibatch size must be at least 1 sample");
  if (options.epoch_size && *options.epoch_size == 0) return absl::InvalidArgumentError("epoch size must be at least 1 sample");
  if (options.world == 0) return absl::InvalidArgumentError("world must be at least 1");
  if (options.rank >= options.world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is not below world ", options.world));
  }
  if (options.truncation > 0 && options.randomizer.frame_mode) {
    return absl::InvalidArgumentError("frame mode and truncated BPTT cannot be combined");
  }
  if (options.randomizer.randomize && options.randomizer.window == 0) {
    return absl::InvalidArgumentError("randomization window must be at least 1");
  }
  return std::unique_ptr<Planner>(new Planner(index, options));
}

Planner::Planner(const Index* index, const PlannerOptions& options) : index_(index), options_(options) {
  epoch_size_ = options_.epoch_size.value_or(index_->total_samples);
  if (options_.truncation > 0) {
    slots_ = options_.parallel > 0 ? options_.parallel
                                   : static_cast<uint32_t>(std::max<uint64_t>(1, options_.minibatch_size / options_.truncation));
    state_.slots.resize(slots_);
    chunk_of_sequence_.resize(index_->sequences.size());
    for (uint32_t c = 0; c < index_->chunks.size(); ++c) {
      const ChunkEntry& ch = index_->chunks[c];
      std::fill(chunk_of_sequence_.begin() + ch.first_sequence,
                chunk_of_sequence_.begin() + ch.first_sequence + ch.num_sequences, c);
    }
  }
}

uint64_t Planner::last_sweep() const {
  if (index_->total_samples == 0) return 0;
  const uint64_t end = SaturatingMul(options_.epochs, epoch_size_);  // samples of the timeline planned
  return end == 0 ? 0 : (end - 1) / index_->total_samples;
}

absl::Status Planner::Resume(const CursorState& state) {
  // Its epoch, batch and place on the timeline agree (a cursor is checked, not signed: one
  // edited by hand must not label sweep 0's batches as epoch 2's, nor wrap batch numbers).
  const uint64_t total = index_->total_samples;
  if (total > 0) {
    if (state.sweep > (UINT64_MAX - state.sample_in_sweep) / total) {
      return absl::InvalidArgumentError("cursor position lies past the end of the stream");
    }
    const uint64_t at = state.sweep * total + state.sample_in_sweep;
    const uint64_t epoch_begin = SaturatingMul(state.epoch, epoch_size_);
    // (No upper bound on `at`: a sequence longer than an epoch, or a full minibatch, ends
    // past the next epoch's end while the cursor moves on by one epoch.)
    if (state.epoch > options_.epochs || at < epoch_begin ||
        (options_.truncation == 0 && state.batch > at - epoch_begin)) {
      return absl::InvalidArgumentError(absl::StrCat("cursor says epoch ", state.epoch, ", batch ", state.batch,
                                                     " at sample ", at, ", which do not agree for this stream"));
    }
  }
  return Seek(state);
}

absl::Status Planner::Seek(const CursorState& state) {
  const uint64_t n = index_->chunks.size();
  if ((n > 0 && state.segment >= n) || state.sample_in_sweep > index_->total_samples) {
    return absl::InvalidArgumentError("cursor position lies outside this dataset");
  }
  if (state.slots.size() != state_.slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat("cursor has ", state.slots.size(), " BPTT slots, this stream has ",
                                                   state_.slots.size()));
  }
  for (const auto& slot : state.slots) {
    if (slot.active && (slot.sequence >= index_->sequences.size() ||
                        slot.offset >= index_->sequences[slot.sequence].num_samples)) {
      return absl::InvalidArgumentError("cursor BPTT slot lies outside this dataset");
    }
  }
  state_ = state;
  order_.reset();
  order_sweep_ = UINT64_MAX;
  segment_ = nullptr;
  loaded_segment_ = UINT64_MAX;
  if (n > 0) {
    OpenSweep(state_.sweep, state_.segment);
    const HugeVector<Unit>& seg = order_->Segment(state_.segment);
    if (state_.offset > seg.size()) return absl::InvalidArgumentError("cursor offset lies outside its segment");
    segment_ = &seg;
    loaded_segment_ = state_.segment;
  }
  return absl::OkStatus();
}

void Planner::OpenSweep(uint64_t sweep, uint64_t segment) {
  order_ = std::make_unique<SweepOrder>(index_, options_.randomizer, sweep);
  order_sweep_ = sweep;
  const uint64_t n = index_->chunks.size();
  last_segment_.resize(n);
  for (uint64_t p = 0; p < n; ++p) last_segment_[p] = order_->LastSegment(p);
  // Positions whose every unit lies before `segment` were done before this sweep was entered.
  exhausted_upto_ = 0;
  while (exhausted_upto_ < n && last_segment_[exhausted_upto_] < segment) ++exhausted_upto_;
}

void Planner::NoteExhausted(uint64_t up_to_segment, std::vector<uint32_t>* out) {
  const uint64_t n = last_segment_.size();
  while (exhausted_upto_ < n && last_segment_[exhausted_upto_] < up_to_segment) {
    out->push_back(order_->chunk_at(exhausted_upto_++));
  }
}

const Unit* Planner::Peek() {
  const uint64_t n = index_->chunks.size();
  if (n == 0 || index_->total_samples == 0) return nullptr;
  while (true) {
    if (!order_ || order_sweep_ != state_.sweep) {
      OpenSweep(state_.sweep, state_.segment);
      loaded_segment_ = UINT64_MAX;
    }
    if (loaded_segment_ != state_.segment) {
      segment_ = &order_->Segment(state_.segment);
      loaded_segment_ = state_.segment;
    }
    if (state_.offset < segment_->size()) return &(*segment_)[state_.offset];
    // Segment done: the next one, or the next sweep.
    state_.offset = 0;
    if (state_.segment + 1 < n) {
      ++state_.segment;
      NoteExhausted(state_.segment, &pending_exhausted_);
    } else {
      NoteExhausted(n, &pending_exhausted_);
      ++state_.sweep;
      state_.segment = 0;
      state_.sample_in_sweep = 0;
    }
  }
}

void Planner::Advance() {
  state_.sample_in_sweep += (*segment_)[state_.offset].samples;
  ++state_.offset;
}

std::optional<PlannedBatch> Planner::Next() {
  if (index_->total_samples == 0 || epoch_size_ == 0) return std::nullopt;
  while (state_.epoch < options_.epochs) {
    // The timeline has 2^64 samples: an epoch that would start past them holds none, nor do
    // the ones after it (not walked one by one: that spun for minutes at 2^32 epochs).
    if (state_.epoch > 0 && epoch_size_ > UINT64_MAX / state_.epoch) break;
    auto b = options_.truncation > 0 ? NextTruncated() : NextFrameOrSequence();
    if (b) return b;
    // An epoch in which no unit starts (epochs shorter than a unit): the next unit starts in
    // epoch Position() / epochSize, and every epoch before it is empty too. Skip them at
    // once rather than one by one (2^32 empty epochs must cost nothing). Not while a BPTT
    // slot still drains a sequence: its steps belong to the epoch it started in.
    if (AnySlotActive(state_.slots)) continue;
    if (Peek() == nullptr) break;
    const uint64_t next_epoch = Position() / epoch_size_;
    if (next_epoch > state_.epoch) {
      state_.epoch = next_epoch;
      state_.batch = 0;
    }
  }
  return std::nullopt;
}

void Planner::Step(PlannedBatch* b) {
  if (b->end_of_epoch) {
    ++state_.epoch;
    state_.batch = 0;
  } else {
    ++state_.batch;
  }
  b->after = state_;
}

std::optional<PlannedBatch> Planner::NextFrameOrSequence() {
  const uint64_t epoch_end = SaturatingMul(state_.epoch + 1, epoch_size_);
  PlannedBatch b;
  b.epoch = state_.epoch;
  b.batch = state_.batch;
  b.pieces.reserve(std::min<uint64_t>(options_.minibatch_size / options_.world + 1, 1 << 16));
  const uint64_t sweep = state_.sweep;
  const bool full = options_.full_minibatches;
  uint64_t units = 0;  // of the global minibatch so far
  rank_loads_.clear();
  uint32_t chunk = UINT32_MAX;  // the chunk of the last piece made, and its first sequence
  uint64_t first_sequence = 0;
  while (true) {
    const Unit* u = Peek();
    if (u == nullptr) break;
    if (!full && state_.sweep != sweep) break;
    // The units left in this segment, taken without going back to Peek(): the sweep does not
    // change within a segment, and the checks below are Peek()'s loop's, unit by unit.
    const Unit* const seg = segment_->data();
    const size_t seg_size = segment_->size();
    size_t offset = state_.offset;
    uint64_t position = Position();
    uint64_t in_sweep = state_.sample_in_sweep, samples = b.global_samples;
    uint32_t rows = b.rows;
    bool cut = false;
    for (; offset < seg_size; ++offset) {
      const Unit& v = seg[offset];
      if ((position >= epoch_end && (!full || samples == 0)) ||
          (samples > 0 && samples + v.samples > options_.minibatch_size)) {
        cut = true;
        break;
      }
      const uint64_t unit = units++;
      samples += v.samples;
      if (TakesUnit(v, unit)) {
        if (v.chunk != chunk) {
          chunk = v.chunk;
          first_sequence = index_->chunks[chunk].first_sequence;
        }
        // Written in place: a Piece built on the stack and then pushed was stored field by
        // field and reloaded 16 bytes at a time, a failed store-to-load forward each unit
        // (half of this function's time in perf).
        Piece& p = b.pieces.emplace_back();
        p.sequence = v.sequence;
        p.chunk = v.chunk;
        p.index_in_chunk = static_cast<uint32_t>(v.sequence - first_sequence);
        p.frame = v.frame;
        if (v.frame != Unit::kWholeSequence) {
          p.sample_begin = v.frame;
          p.sample_count = 1;
        }
        p.row = rows++;
      }
      position += v.samples;
      in_sweep += v.samples;
    }
    state_.sample_in_sweep = in_sweep;
    b.global_samples = samples;
    b.rows = rows;
    state_.offset = offset;
    if (cut) break;
  }
  // Look at what comes next: it decides the ends of sweep and epoch.
  const Unit* next = Peek();
  b.end_of_sweep = state_.sweep != sweep;
  b.end_of_epoch = next == nullptr || Position() >= epoch_end;
  b.exhausted_chunks.swap(pending_exhausted_);
  Step(&b);
  if (b.global_samples == 0) return std::nullopt;  // an epoch in which no unit starts
  return b;
}

bool Planner::TakesBalancedUnit(const Unit& u, uint64_t unit) {
  const uint32_t w = options_.world;
  // Balanced: the first `w` units go to ranks 0..w-1 (each holds nothing yet; ties go to the
  // lowest rank), then each to the rank holding the fewest samples.
  if (unit < w) {
    rank_loads_.emplace_back(u.samples, static_cast<uint32_t>(unit));
    if (unit + 1 == w) std::make_heap(rank_loads_.begin(), rank_loads_.end(), std::greater<>());
    return unit == options_.rank;
  }
  std::pop_heap(rank_loads_.begin(), rank_loads_.end(), std::greater<>());
  auto& least = rank_loads_.back();
  least.first += u.samples;
  const bool mine = least.second == options_.rank;
  std::push_heap(rank_loads_.begin(), rank_loads_.end(), std::greater<>());
  return mine;
}

absl::Status Planner::SeekEpoch(uint64_t epoch) {
  if (epoch == 0) return absl::OkStatus();
  if (epoch >= options_.epochs) {
    return absl::InvalidArgumentError(absl::StrCat("first epoch ", epoch, " is not before the last epoch asked for (",
                                                   options_.epochs, " epochs, counted from 0)"));
  }
  if (epoch > 0 && epoch_size_ > UINT64_MAX / epoch) {
    return absl::InvalidArgumentError(absl::StrCat("first epoch ", epoch, " of ", epoch_size_,
                                                   " samples each would start past 2^64 samples, where no data is"));
  }
  const uint64_t sweep_samples = index_->total_samples;
  if (sweep_samples == 0 || index_->chunks.empty()) return absl::OkStatus();
  const uint64_t units = options_.randomizer.frame_mode ? sweep_samples : index_->sequences.size();
  if (options_.full_minibatches || options_.truncation > 0) {
    // A minibatch may run past its epoch's end: only planning the epochs before says where
    // this one starts.
    if (static_cast<unsigned __int128>(epoch) * units > kMaxReplayUnits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "starting at epoch ", epoch, " in full minibatch mode or truncated BPTT means planning the ", epoch,
          " epochs before it (", units, " units each); resume from a cursor instead"));
    }
    while (state_.epoch < epoch && Next()) {
    }
    return absl::OkStatus();
  }
  // Epoch e starts with the first unit that starts at or after e * epochSize.
  const uint64_t target = SaturatingMul(epoch, epoch_size_);
  CursorState s;
  s.slots = state_.slots;
  s.sweep = target / sweep_samples;
  RETURN_IF_ERROR(Seek(s));
  while (Position() < target && Peek() != nullptr) Advance();
  state_.epoch = epoch;
  state_.batch = 0;
  pending_exhausted_.clear();  // chunks before the start were never opened
  return absl::OkStatus();
}

std::optional<PlannedBatch> Planner::NextTruncated() {
  const uint64_t epoch_end = SaturatingMul(state_.epoch + 1, epoch_size_);
  const uint32_t T = options_.truncation;
  PlannedBatch b;
  b.epoch = state_.epoch;
  b.batch = state_.batch;
  b.steps = T;
  bool any = false;
  const uint64_t sweep = state_.sweep;
  for (uint32_t j = 0; j < slots_; ++j) {
    const bool local = j % options_.world == options_.rank;
    const uint32_t row = j / options_.world;
    if (local) b.rows = row + 1;
    CursorState::Slot& slot = state_.slots[j];
    uint32_t t = 0;
    while (t < T) {
      if (!slot.active) {
        // A new sequence joins this slot unless the epoch (or sweep) is over.
        const Unit* u = Peek();
        if (u == nullptr || state_.sweep != sweep || Position() >= epoch_end) break;
        slot.active = true;
        slot.sequence = u->sequence;
        slot.offset = 0;
        b.global_samples += u->samples;
        Advance();
      }
      const uint32_t len = index_->sequences[slot.sequence].num_samples;
      const uint32_t take = std::min<uint32_t>(T - t, len - slot.offset);
      if (local) b.pieces.push_back(SlotPiece(*index_, chunk_of_sequence_[slot.sequence], slot, take, row, t));
      any = true;
      t += take;
      slot.offset += take;
      if (slot.offset == len) slot = CursorState::Slot();
    }
  }
  b.rows = options_.rank < slots_ ? (slots_ - 1 - options_.rank) / options_.world + 1 : 0;
  const bool draining = AnySlotActive(state_.slots);
  const Unit* next = Peek();
  const bool no_more = next == nullptr || state_.sweep != sweep || Position() >= epoch_end;
  b.end_of_sweep = state_.sweep != sweep;
  b.end_of_epoch = no_more && !draining;
  deferred_exhausted_.insert(deferred_exhausted_.end(), pending_exhausted_.begin(), pending_exhausted_.end());
  pending_exhausted_.clear();
  ReleaseUnheldChunks(state_.slots, chunk_of_sequence_, &deferred_exhausted_, &b.exhausted_chunks);
  Step(&b);
  if (!any) return std::nullopt;
  return b;
}

}  // namespace conveyor
