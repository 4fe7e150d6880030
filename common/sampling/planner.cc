#include "common/sampling/planner.h"

#include <algorithm>

namespace conveyor {

absl::StatusOr<FileOrderPlanner> FileOrderPlanner::Create(const Index* index,
                                                          const PlannerOptions& options) {
  if (options.minibatch_size == 0) return absl::InvalidArgumentError("minibatch size must be at least 1 sample");
  if (options.epoch_size && *options.epoch_size == 0) return absl::InvalidArgumentError("epoch size must be at least 1 sample");
  return FileOrderPlanner(index, options);
}

FileOrderPlanner::FileOrderPlanner(const Index* index, const PlannerOptions& options)
    : index_(index), options_(options) {
  const auto& seqs = index_->sequences;
  start_.resize(seqs.size());
  chunk_of_.resize(seqs.size());
  uint64_t pos = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    start_[i] = pos;
    pos += seqs[i].num_samples;
  }
  for (size_t c = 0; c < index_->chunks.size(); ++c) {
    const ChunkEntry& ch = index_->chunks[c];
    std::fill(chunk_of_.begin() + ch.first_sequence,
              chunk_of_.begin() + ch.first_sequence + ch.num_sequences, c);
  }
  epoch_size_ = options_.epoch_size.value_or(pos);
}

void FileOrderPlanner::StartEpoch() {
  const uint64_t sweep_samples = index_->total_samples;
  const uint64_t begin = epoch_ * epoch_size_;
  sweep_ = begin / sweep_samples;
  const uint64_t offset = begin % sweep_samples;
  seq_ = std::lower_bound(start_.begin(), start_.end(), offset) - start_.begin();
  if (seq_ == start_.size()) {  // nothing starts in the rest of this sweep
    ++sweep_;
    seq_ = 0;
  }
  batch_ = 0;
  in_epoch_ = true;
}

std::optional<PlannedBatch> FileOrderPlanner::Next() {
  const auto& seqs = index_->sequences;
  if (seqs.empty() || index_->total_samples == 0 || epoch_size_ == 0) return std::nullopt;
  const uint64_t sweep_samples = index_->total_samples;
  auto position = [&] { return sweep_ * sweep_samples + start_[seq_]; };
  while (true) {
    if (!in_epoch_) {
      if (epoch_ >= options_.epochs) return std::nullopt;
      StartEpoch();
    }
    const uint64_t epoch_end = (epoch_ + 1) * epoch_size_;
    PlannedBatch b;
    b.epoch = epoch_;
    b.batch = batch_;
    while (position() < epoch_end) {
      const uint64_t len = seqs[seq_].num_samples;
      if (!b.sequences.empty() && b.planned_samples + len > options_.minibatch_size) break;
      const uint64_t c = chunk_of_[seq_];
      b.sequences.push_back({c, static_cast<uint32_t>(seq_ - index_->chunks[c].first_sequence)});
      b.planned_samples += len;
      if (++seq_ == seqs.size()) {  // end of a sweep: the minibatch ends here too
        seq_ = 0;
        ++sweep_;
        break;
      }
    }
    b.end_of_epoch = position() >= epoch_end;
    if (b.end_of_epoch) {
      in_epoch_ = false;
      ++epoch_;
    }
    if (b.sequences.empty()) continue;  // an epoch in which no sequence starts
    ++batch_;
    return b;
  }
}

}  // namespace conveyor
