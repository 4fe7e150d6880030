#include "common/sampling/loader.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(const Dataset* dataset,
                                                       BatchAssembler* assembler,
                                                       const LoaderOptions& options) {
  if (options.threads < 1) return absl::InvalidArgumentError("threads must be at least 1");
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, Planner::Create(&dataset->index(), options.planner));
  if (options.batch_stride == 0 || options.batch_offset >= options.batch_stride) {
    return absl::InvalidArgumentError(absl::StrCat("batch offset ", options.batch_offset, " must be below the stride ",
                                                   options.batch_stride));
  }
  if (options.resume) {
    RETURN_IF_ERROR(planner->Resume(*options.resume));
  } else if (options.first_epoch > 0) {
    RETURN_IF_ERROR(planner->SeekEpoch(options.first_epoch));
  }
  return std::unique_ptr<Loader>(new Loader(dataset, assembler, std::move(planner), options));
}

Loader::Loader(const Dataset* dataset, BatchAssembler* assembler, std::unique_ptr<Planner> planner,
               const LoaderOptions& options)
    : dataset_(dataset), assembler_(assembler), planner_(std::move(planner)),
      bptt_(options.planner.truncation > 0), layouts_(options.layouts), value_dtypes_(options.value_dtypes),
      batch_stride_(options.batch_stride), batch_offset_(options.batch_offset),
      min_plan_range_pieces_(std::max<size_t>(options.min_plan_range_pieces, 1)) {
  ChunkPipelineOptions po;
  po.pool = options.pool;
  po.threads = options.threads;
  // A loader of its own threads counts its caller's among them (see LoaderOptions::threads).
  // Two chunks ahead per thread, the caller's included: with one ahead per pool thread, a
  // pool thread that has parsed its chunk waits while the caller parses the next (CTF dense,
  // 2 threads: 1248 MB/s against 1396 with 2 per thread; bench/RESULTS.md).
  po.consumer_parses = options.pool == nullptr;
  po.prefetch = options.prefetch > 0 ? options.prefetch : 2 * options.threads;
  po.keep_all = dataset->config().keep_data_in_memory;
  po.admit = options.admit_chunk;
  lookahead_chunks_ = static_cast<uint64_t>(po.prefetch);
  pipeline_ = std::make_unique<ChunkPipeline>(dataset, po);
  // Parser threads with no chunk to parse help assemble (the same bytes on any number); a
  // pool of none (`threads` 1 of its own) has no helper to offer.
  if (pipeline_->pool()->threads() > 0) assembler_->set_helpers(pipeline_->pool());
}

Loader::~Loader() {
  // Batches begun may still be read from their chunks: wait for them first.
  for (const auto& f : in_flight_) (void)assembler_->Wait(f->fence);
  in_flight_.clear();
  assembler_->set_helpers(nullptr);
  pipeline_.reset();
  std::free(buffer_);
}

void Loader::Unref(uint64_t ticket) {
  auto it = ticket_refs_.find(ticket);
  if (it != ticket_refs_.end() && it->second > 0) --it->second;
  if ((it == ticket_refs_.end() || it->second == 0) && closed_.count(ticket)) {
    closed_.erase(ticket);
    ticket_refs_.erase(ticket);
    if (fetched_.erase(ticket) == 0 && scheduled_ahead_ > 0) --scheduled_ahead_;  // never used
    pipeline_->Release(ticket);
  }
}

void Loader::Cancel() {
  cancelled_.store(true);
  pipeline_->Cancel();
}

void Loader::CloseChunks(const std::vector<uint32_t>& chunks) {
  for (uint32_t c : chunks) {
    auto it = open_.find(c);
    if (it == open_.end()) continue;
    const uint64_t t = it->second;
    open_.erase(it);
    closed_.insert(t);
    if (ticket_refs_[t] == 0) Unref(t);
  }
}

void Loader::PrefetchAhead() {
  // Truncated BPTT assigns sequences to slots, not chunks to ranks: it reads on demand.
  if (bptt_) return;
  const PlannerOptions& o = planner_->options();
  const uint64_t n = dataset_->index().chunks.size();
  if (n == 0) return;
  const CursorState& at = planner_->state();
  if (!prefetch_started_ || prefetch_sweep_ < at.sweep || (prefetch_sweep_ == at.sweep && prefetch_pos_ < at.segment)) {
    prefetch_started_ = true;
    prefetch_sweep_ = at.sweep;
    prefetch_pos_ = at.segment;
    prefetch_order_ = ChunkOrder(n, o.randomizer, prefetch_sweep_);
  }
  // Positions up to `lookahead_chunks_` owned chunks beyond the planner's segment, and no
  // further than one sweep (n positions) ahead of it: a rank that owns no chunk, or a
  // dataset whose every chunk is open already, must not walk the sweeps of every epoch.
  const uint64_t last_sweep = planner_->last_sweep();
  using u128 = unsigned __int128;
  const u128 horizon = static_cast<u128>(at.sweep) * n + at.segment + n;
  while (scheduled_ahead_ < lookahead_chunks_ && prefetch_sweep_ <= last_sweep &&
         static_cast<u128>(prefetch_sweep_) * n + prefetch_pos_ < horizon) {
    const uint64_t pos = prefetch_pos_;
    if (planner_->MayUse(pos)) {
      const uint32_t chunk = prefetch_order_[pos];
      if (open_.find(chunk) == open_.end()) {
        open_.emplace(chunk, pipeline_->Enqueue(chunk));
        ++scheduled_ahead_;
      } else if (prefetch_sweep_ > at.sweep) {
        // Still open for the sweep being planned (a wide window holds every chunk to the
        // sweep's end): it is this later sweep's to schedule once that plan closes it, so
        // wait here rather than pass it and run on to chunks needed much later.
        break;
      }
    }
    if (++prefetch_pos_ == n) {
      prefetch_pos_ = 0;
      ++prefetch_sweep_;
      prefetch_order_ = ChunkOrder(n, o.randomizer, prefetch_sweep_);
    }
  }
}

void Loader::PlanAhead() {
  // At least one batch planned; then more while fewer than `lookahead_chunks_` chunks are
  // scheduled ahead of the consumer (bounded, for datasets of very few chunks).
  // Pieces planned ahead are bounded too: a minibatch of 2^24 frames is 2^24 pieces.
  const size_t max_planned = 4 + 4 * lookahead_chunks_;
  while (!planner_done_ && !cancelled_.load() &&
         (planned_.empty() ||
          (scheduled_ahead_ < lookahead_chunks_ && planned_.size() < max_planned && planned_pieces_ < kMaxPiecesAhead))) {
    std::optional<PlannedBatch> b = planner_->Next();
    if (!b) {
      planner_done_ = true;
      break;
    }
    if (batches_planned_++ % batch_stride_ != batch_offset_) {
      CloseChunks(b->exhausted_chunks);  // another worker's batch
      continue;
    }
    Planned p;
    p.batch = std::move(*b);
    p.piece_chunk.reserve(p.batch.pieces.size());
    if (marks_.empty()) marks_.resize(dataset_->index().chunks.size());
    uint32_t last_chunk = UINT32_MAX;
    uint32_t place = 0;
    for (const Piece& piece : p.batch.pieces) {
      if (piece.chunk != last_chunk) {
        ChunkMark& m = marks_[piece.chunk];
        if (m.batch != batches_planned_) {  // the batch's first piece of this chunk
          auto it = open_.find(piece.chunk);
          if (it == open_.end()) {
            it = open_.emplace(piece.chunk, pipeline_->Enqueue(piece.chunk)).first;
            ++scheduled_ahead_;
          }
          m.batch = batches_planned_;
          m.place = static_cast<uint32_t>(p.distinct.size());
          p.distinct.push_back(it->second);
        }
        last_chunk = piece.chunk;
        place = m.place;
      }
      p.piece_chunk.push_back(place);
    }
    for (uint64_t t : p.distinct) ++ticket_refs_[t];
    planned_pieces_ += p.batch.pieces.size();
    CloseChunks(p.batch.exhausted_chunks);
    planned_.push_back(std::move(p));
  }
  PrefetchAhead();
}

absl::StatusOr<bool> Loader::Next(Batch* out, const BatchDestination& destination) {
  if (!in_flight_.empty()) return absl::FailedPreconditionError("Next() while batches begun are not completed");
  BatchDestination own = [this](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
    if (bytes > buffer_size_) {
      std::free(buffer_);
      buffer_size_ = std::max<size_t>(bytes, buffer_size_ * 3 / 2);
      buffer_size_ = (buffer_size_ + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment;
      buffer_ = static_cast<std::byte*>(std::aligned_alloc(kArrayAlignment, std::max<size_t>(buffer_size_, kArrayAlignment)));
      if (buffer_ == nullptr) {
        buffer_size_ = 0;
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", bytes, "-byte batch"));
      }
    }
    return absl::MakeSpan(buffer_, bytes);
  };
  ASSIGN_OR_RETURN(bool more, Begin(destination ? destination : own));
  if (!more) return false;
  RETURN_IF_ERROR(Complete(out));
  return true;
}

absl::StatusOr<bool> Loader::Begin(const BatchDestination& destination) {
  if (cancelled_.load()) return absl::CancelledError("the stream was cancelled");
  PlanAhead();
  if (cancelled_.load()) return absl::CancelledError("the stream was cancelled");
  if (planned_.empty()) return false;
  Planned p = std::move(planned_.front());
  planned_.pop_front();
  planned_pieces_ -= p.batch.pieces.size();
  auto f = std::make_unique<InFlight>();
  std::vector<PieceRef>& refs = f->refs;
  refs.reserve(p.batch.pieces.size());
  absl::Status failed;
  // The batch's chunks, waited for in the order its pieces first use them.
  f->held.reserve(p.distinct.size());
  for (uint64_t t : p.distinct) {
    auto chunk = pipeline_->Get(t);
    if (!chunk.ok()) {
      failed = chunk.status();
      break;
    }
    if (fetched_.insert(t).second && scheduled_ahead_ > 0) --scheduled_ahead_;
    f->held.push_back(*std::move(chunk));
  }
  uint32_t rows = bptt_ ? p.batch.rows : 0;
  const bool frame_mode = planner_->options().randomizer.frame_mode;
  const size_t n = failed.ok() ? p.batch.pieces.size() : 0;
  // Randomized, each piece's slot lies in another chunk's table: ask for it kAhead pieces ahead
  // (a miss takes several hundred ns here). A chunk that kept every sequence has no table to
  // read (identity_slots).
  constexpr size_t kAhead = 32;
  auto prefetch_slot = [&](size_t i) __attribute__((always_inline)) {
    const ParsedChunk* chunk = f->held[p.piece_chunk[i]].get();
    if (!chunk->identity_slots) __builtin_prefetch(&chunk->slot_of[p.batch.pieces[i].index_in_chunk]);
  };
  for (size_t i = 0; i < std::min(n, kAhead); ++i) prefetch_slot(i);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_slot(i + kAhead);
    const Piece& piece = p.batch.pieces[i];
    const ParsedChunk* chunk = f->held[p.piece_chunk[i]].get();
    const int32_t slot = chunk->identity_slots ? static_cast<int32_t>(piece.index_in_chunk)
                                               : chunk->slot_of[piece.index_in_chunk];
    if (slot < 0) continue;  // dropped as bad: a gap in BPTT, one row less otherwise
    PieceRef& r = refs.emplace_back();  // in place, not copied from the stack (as in the planner)
    r.chunk = chunk;
    r.slot = static_cast<uint32_t>(slot);
    r.sample_begin = piece.sample_begin;
    r.sample_count = piece.sample_count;
    r.row = bptt_ ? piece.row : rows++;
    r.t0 = piece.t0;
    r.begins = piece.begins;
    r.ends = piece.ends;
    if (frame_mode && dataset_->index().sequences[piece.sequence].num_samples > 1) r.frame = piece.frame;
  }
  f->used = std::move(p.distinct);
  std::sort(f->used.begin(), f->used.end());  // released in ticket order, as before
  auto give_back = [&] {
    f->held.clear();
    for (uint64_t t : f->used) Unref(t);
  };
  if (!failed.ok()) {
    give_back();
    return failed;
  }
  BatchShape shape;
  shape.rows = rows;
  shape.steps = p.batch.steps;
  shape.frame_mode = frame_mode;
  // A big batch's pieces are placed in ranges on the parser threads free to help (those owed
  // no chunk, whatever the cores: one busy with the batch before takes what is left once done
  // with it, one parsing would come too late), so the planning of one subscription is not
  // bound to this thread (the same plan on any number). Only where those threads then
  // assemble it, as the assembler does batches like the last one: a range placed on another
  // core and read back by this thread's own assembly costs more in misses than it saved.
  PlanThreads plan_threads;
  ParserPool* pool = pipeline_->pool();
  if (pool != nullptr && refs.size() / 2 >= min_plan_range_pieces_ &&
      assembler_->SplitsBatchesOf(last_plan_bytes_)) {
    const int helpers = pool->unowed();
    plan_threads.workers = 1 + helpers;
    plan_threads.min_range_pieces = min_plan_range_pieces_;
    plan_threads.run = [pool, helpers](size_t tasks, const std::function<void(size_t)>& task) {
      RunWithHelpers(pool, helpers, tasks, task);
    };
  }
  auto plan = PlanBatch(dataset_->streams(), dataset_->config().precision, shape, refs, layouts_, value_dtypes_,
                        &spare_plan_, &plan_threads);
  if (!plan.ok()) {
    give_back();
    return plan.status();
  }
  last_plan_bytes_ = plan->total_bytes;
  auto given = destination(plan->total_bytes);
  if (!given.ok() || given->size() < plan->total_bytes) {
    give_back();
    return given.ok() ? absl::InternalError("the batch destination is too small") : given.status();
  }
  f->dst = given->subspan(0, plan->total_bytes);
  Batch& b = f->batch;
  b.epoch = p.batch.epoch;
  b.index = p.batch.batch;
  b.end_of_epoch = p.batch.end_of_epoch;
  b.end_of_sweep = p.batch.end_of_sweep;
  b.dropped = static_cast<uint32_t>(n - refs.size());
  b.plan = std::move(*plan);
  b.after = p.batch.after;
  auto fence = assembler_->Begin(b.plan, refs, f->dst);
  if (!fence.ok()) {
    give_back();
    return fence.status();
  }
  f->fence = *fence;
  in_flight_.push_back(std::move(f));
  return true;
}

absl::Status Loader::Complete(Batch* out) {
  if (in_flight_.empty()) return absl::FailedPreconditionError("Complete() without a batch begun");
  std::unique_ptr<InFlight> f = std::move(in_flight_.front());
  in_flight_.pop_front();
  absl::Status st = assembler_->Wait(f->fence);
  // Values assembled from where they lie in a mapped file (Kaldi FM/DM): none from a file cut
  // short since its chunk was parsed. Before the chunks are given back.
  if (st.ok()) st = dataset_->CheckReads();
  f->held.clear();
  for (uint64_t t : f->used) Unref(t);
  RETURN_IF_ERROR(st);
  // Swapped, not assigned: what `out` held (the caller's previous batch, which this call
  // replaces) comes back here, and its plan's arrays serve the next batch planned.
  std::swap(*out, f->batch);
  spare_plan_.pieces = std::move(f->batch.plan.pieces);  // (what PlanBatch reuses, no more)
  spare_plan_.counts = std::move(f->batch.plan.counts);
  // The entry addresses of the batch handed out point into the chunks just given back: not
  // the caller's to read. Kept at their size for the next plan, which overwrites every one
  // (instead of zeroing a cleared array first and then writing it).
  spare_plan_.entries = std::move(out->plan.entries);
  out->plan.entries.clear();
  out->bytes = absl::MakeConstSpan(f->dst.data(), out->plan.total_bytes);
  return absl::OkStatus();
}

absl::Status RunPipelined(Loader* loader, size_t depth, const BatchDestination& destination,
                          const std::function<absl::Status(const Batch&)>& each) {
  bool more = true;
  Batch b;
  while (true) {
    while (more && loader->in_flight() < std::max<size_t>(depth, 1)) {
      ASSIGN_OR_RETURN(more, loader->Begin(destination));
    }
    if (loader->in_flight() == 0) return absl::OkStatus();
    RETURN_IF_ERROR(loader->Complete(&b));
    RETURN_IF_ERROR(each(b));
  }
}


absl::Status RunWithOwnBuffers(Loader* loader, const std::function<absl::Status(const Batch&)>& each) {
  struct Buffer {
    std::byte* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  const size_t depth = loader->pipelined() ? 2 : 1;
  // With at most `depth` batches alive (begun, or being used by `each`), the buffer a batch
  // is begun into was last used `depth` batches ago: that batch is done with.
  std::vector<Buffer> buffers(depth);
  size_t next = 0;
  BatchDestination own = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
    Buffer& b = buffers[next++ % depth];
    if (bytes > b.size) {
      std::free(b.data);
      b.size = (std::max<size_t>(bytes, b.size * 3 / 2) + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment;
      b.data = static_cast<std::byte*>(std::aligned_alloc(kArrayAlignment, std::max<size_t>(b.size, kArrayAlignment)));
      if (b.data == nullptr) {
        b.size = 0;
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", bytes, "-byte batch"));
      }
    }
    return absl::MakeSpan(b.data, bytes);
  };
  return RunPipelined(loader, depth, own, each);
}

}  // namespace conveyor
