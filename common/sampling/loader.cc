#include "common/sampling/loader.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(const Dataset* dataset,
                                                       BatchAssembler* assembler,
                                                       const LoaderOptions& options) {
  if (options.threads < 1) return absl::InvalidArgumentError("threads must be at least 1");
  ASSIGN_OR_RETURN(FileOrderPlanner planner, FileOrderPlanner::Create(&dataset->index(), options.planner));
  return std::unique_ptr<Loader>(new Loader(dataset, assembler, std::move(planner), options));
}

Loader::Loader(const Dataset* dataset, BatchAssembler* assembler, FileOrderPlanner planner,
               const LoaderOptions& options)
    : dataset_(dataset), assembler_(assembler), planner_(std::move(planner)) {
  ChunkPipelineOptions po;
  po.threads = options.threads;
  po.prefetch = options.prefetch > 0 ? options.prefetch : 2 * options.threads;
  po.keep_all = dataset->config().keep_data_in_memory;
  lookahead_chunks_ = static_cast<uint64_t>(po.prefetch);
  pipeline_ = std::make_unique<ChunkPipeline>(dataset, po);
}

Loader::~Loader() {
  pipeline_.reset();
  std::free(buffer_);
}

void Loader::PlanAhead() {
  // Keep at least one batch planned, and enough batches that `lookahead_chunks_` chunks
  // beyond the current batch are scheduled.
  while (!planner_done_ && (planned_.empty() || scheduled_ahead_ < lookahead_chunks_)) {
    std::optional<PlannedBatch> b = planner_.Next();
    if (!b) {
      planner_done_ = true;
      break;
    }
    Planned p;
    p.batch = std::move(*b);
    std::set<uint64_t> used;
    for (const PlannedSequence& s : p.batch.sequences) {
      if (!open_chunk_ || *open_chunk_ != s.chunk) {
        const uint64_t previous = open_ticket_;
        const bool had_open = open_chunk_.has_value();
        open_chunk_ = s.chunk;
        open_ticket_ = pipeline_->Enqueue(s.chunk);
        ++scheduled_ahead_;
        if (had_open && ticket_refs_.count(previous) && ticket_refs_[previous] == 0) {
          ticket_refs_.erase(previous);
          pipeline_->Release(previous);
        }
      }
      p.tickets.push_back(open_ticket_);
      if (used.insert(open_ticket_).second) ++ticket_refs_[open_ticket_];
    }
    planned_.push_back(std::move(p));
  }
}

void Loader::Retire(const Planned& p) {
  std::set<uint64_t> used(p.tickets.begin(), p.tickets.end());
  for (uint64_t t : used) {
    if (--ticket_refs_[t] == 0 && !(open_chunk_ && t == open_ticket_)) {
      ticket_refs_.erase(t);
      pipeline_->Release(t);
    }
  }
}

absl::StatusOr<bool> Loader::Next(Batch* out) {
  while (true) {
    PlanAhead();
    if (planned_.empty()) return false;
    Planned p = std::move(planned_.front());
    planned_.pop_front();
    std::vector<SequenceRef> refs;
    refs.reserve(p.batch.sequences.size());
    std::map<uint64_t, std::shared_ptr<const ParsedChunk>> held;
    absl::Status failed;
    for (size_t i = 0; i < p.batch.sequences.size(); ++i) {
      const uint64_t t = p.tickets[i];
      auto it = held.find(t);
      if (it == held.end()) {
        auto chunk = pipeline_->Get(t);
        if (!chunk.ok()) {
          failed = chunk.status();
          break;
        }
        if (!fetched_any_ || t > last_fetched_) {  // tickets are first fetched in order
          fetched_any_ = true;
          last_fetched_ = t;
          if (scheduled_ahead_ > 0) --scheduled_ahead_;
        }
        it = held.emplace(t, *chunk).first;
      }
      const int32_t slot = it->second->slot_of[p.batch.sequences[i].index_in_chunk];
      if (slot >= 0) refs.push_back({it->second.get(), static_cast<uint32_t>(slot)});
    }
    Retire(p);
    if (!failed.ok()) return failed;
    if (refs.empty()) continue;  // every sequence of this batch was bad and skipped
    ASSIGN_OR_RETURN(BatchPlan plan, PlanBatch(dataset_->streams(), dataset_->config().precision,
                                               dataset_->config().frame_mode, refs));
    if (plan.total_bytes > buffer_size_) {
      std::free(buffer_);
      buffer_size_ = std::max<size_t>(plan.total_bytes, buffer_size_ * 3 / 2);
      buffer_size_ = (buffer_size_ + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment;
      buffer_ = static_cast<std::byte*>(std::aligned_alloc(kArrayAlignment, buffer_size_));
      if (buffer_ == nullptr) {
        buffer_size_ = 0;
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", plan.total_bytes, "-byte batch"));
      }
    }
    RETURN_IF_ERROR(assembler_->Assemble(plan, refs, absl::MakeSpan(buffer_, plan.total_bytes)));
    out->epoch = p.batch.epoch;
    out->index = p.batch.batch;
    out->end_of_epoch = p.batch.end_of_epoch;
    out->plan = std::move(plan);
    out->bytes = absl::MakeConstSpan(buffer_, out->plan.total_bytes);
    return true;
  }
}

}  // namespace conveyor
