#include "common/sampling/chunk_pipeline.h"

#include <algorithm>
#include <chrono>

namespace conveyor {

ChunkPipeline::ChunkPipeline(const Dataset* dataset, const ChunkPipelineOptions& options)
    : state_(std::make_shared<State>()) {
  const int threads = std::max(1, options.threads);
  if (options.pool == nullptr) own_pool_ = std::make_unique<ParserPool>(options.consumer_parses ? threads - 1 : threads);
  state_->dataset = dataset;
  state_->options = options;
  state_->options.consumer_parses = options.consumer_parses && options.pool == nullptr;
  state_->pool = options.pool != nullptr ? options.pool : own_pool_.get();
}

ChunkPipeline::~ChunkPipeline() {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->stop = true;
    // Jobs still queued in the pool return at once when they run (they hold the state);
    // those parsing finish their chunk first, which needs the dataset: wait for them.
    state_->idle_cv.wait(lock, [&] { return state_->parsing == 0; });
  }
  own_pool_.reset();  // runs (and so ends) the jobs queued in it
}

void ChunkPipeline::Schedule(const std::shared_ptr<State>& s) {
  // Until the first chunk is done it is parsed alone: the consumer waits for it (the first
  // batch), and a second chunk parsed beside it takes CPU from it whenever the pipeline's
  // threads outnumber the cores the process gets (issue 19: first batch).
  uint64_t budget = s->first_done ? static_cast<uint64_t>(std::max(1, s->options.threads)) : 1;
  if (s->options.consumer_parses) {
    // The consumer's own thread is one of them (the only one at 1: no job is submitted), and
    // while it parses the first chunk no job starts a second.
    budget = std::min<uint64_t>(budget, static_cast<uint64_t>(s->pool->threads()));
    if (!s->first_done && s->parsing > 0) return;
  }
  // Past the parse-ahead only for chunks the consumer waits for (one job each).
  const uint64_t prefetch = static_cast<uint64_t>(std::max(1, s->options.prefetch));
  while (!s->stop && s->jobs < budget && s->unstarted > s->unclaimed &&
         (s->ahead + s->unclaimed < prefetch || s->wanted > s->unclaimed)) {
    ++s->jobs;
    ++s->unclaimed;
    s->pool->Submit([s] { RunJob(s); });
  }
}

uint64_t ChunkPipeline::Enqueue(uint64_t chunk_id) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t ticket = s.next_ticket++;
  Entry& e = s.entries[ticket];
  e.chunk = chunk_id;
  if (auto it = s.kept.find(chunk_id); it != s.kept.end()) {
    e.started = e.done = true;
    e.data = it->second;
    return ticket;
  }
  ++s.unstarted;
  Schedule(state_);
  return ticket;
}

std::map<uint64_t, ChunkPipeline::Entry>::iterator ChunkPipeline::Claimable(State& s) {
  if (s.stop || !(s.wanted > 0 || s.ahead < static_cast<uint64_t>(std::max(1, s.options.prefetch)))) {
    return s.entries.end();
  }
  // The first chunk is parsed alone (Schedule()): a job submitted for it that finds the
  // consumer parsing it leaves the next one to later.
  if (!s.first_done && s.parsing > 0) return s.entries.end();
  for (auto it = s.entries.begin(); it != s.entries.end(); ++it) {
    if (!it->second.started && (it->second.wanted || s.wanted == 0)) return it;
  }
  return s.entries.end();
}

void ChunkPipeline::Parse(State& s, std::unique_lock<std::mutex>& lock, std::map<uint64_t, Entry>::iterator it) {
  Entry* todo = &it->second;
  const uint64_t ticket = it->first;
  todo->started = true;
  todo->started_at = std::chrono::steady_clock::now();
  if (todo->wanted) --s.wanted;
  todo->counted = true;
  --s.unstarted;
  ++s.ahead;
  ++s.parsing;
  const uint64_t chunk = todo->chunk;
  lock.unlock();
  absl::Status admitted = s.options.admit ? s.options.admit(chunk) : absl::OkStatus();
  if (admitted.ok()) s.dataset->WillNeed(chunk);
  const auto t0 = std::chrono::steady_clock::now();
  bool parsed_here = false;
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> parsed =
      admitted.ok() ? s.dataset->SharedChunk(chunk, &parsed_here)
                    : absl::StatusOr<std::shared_ptr<const ParsedChunk>>(admitted);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lock.lock();
  --s.parsing;
  s.first_done = true;
  if (parsed_here) {
    s.parse_seconds += secs;
    ++s.chunks_parsed;
  }
  // Kept even when its entry was released while it was parsed: a later sweep needs it.
  if (parsed.ok() && s.options.keep_all) s.kept[chunk] = *parsed;
  if (auto found = s.entries.find(ticket); found != s.entries.end()) {  // else released while parsed
    Entry& e = found->second;
    e.done = true;
    if (parsed.ok()) {
      e.data = std::move(*parsed);
    } else {
      e.status = parsed.status();
    }
    s.done_cv.notify_all();
  }
}

void ChunkPipeline::RunJob(const std::shared_ptr<State>& state) {
  State& s = *state;
  std::unique_lock<std::mutex> lock(s.mu);
  --s.unclaimed;
  if (auto it = Claimable(s); it != s.entries.end()) Parse(s, lock, it);
  --s.jobs;
  Schedule(state);
  s.idle_cv.notify_all();
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> ChunkPipeline::Get(uint64_t ticket) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  auto it = s.entries.find(ticket);
  if (it == s.entries.end()) return absl::InternalError("unknown chunk ticket");
  if (!it->second.started && !it->second.wanted) {
    it->second.wanted = true;
    ++s.wanted;
    Schedule(state_);
  }
  if (s.options.consumer_parses) {
    // This thread is one of the pipeline's: rather than wait, it parses its own chunk when no
    // job has started it, or (after the first chunk, as jobs do) one not yet started ahead.
    while (!it->second.done && !s.cancelled) {
      // Its own chunk, waited for and not started, is what Claimable() picks (the one entry
      // wanted: this thread is the only one that waits), under the same rules as a job's.
      auto todo = s.entries.end();
      if (!it->second.started) {
        todo = Claimable(s);
      } else if (s.first_done && s.chunks_parsed > 0) {
        const double average = s.parse_seconds / static_cast<double>(s.chunks_parsed);
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.started_at).count();
        if (average - elapsed > average / 2) todo = Claimable(s);
      }
      if (todo == s.entries.end()) {
        s.done_cv.wait(lock);
        continue;
      }
      Parse(s, lock, todo);
      Schedule(state_);
      s.idle_cv.notify_all();
    }
  }
  s.done_cv.wait(lock, [&] { return it->second.done || s.cancelled; });
  if (s.cancelled) return absl::CancelledError("the stream was cancelled");
  if (!it->second.taken) {
    it->second.taken = true;
    if (it->second.counted) {  // a job may now run one chunk further ahead
      --s.ahead;
      Schedule(state_);
    }
  }
  if (!it->second.status.ok()) return it->second.status;
  return it->second.data;
}

void ChunkPipeline::Release(uint64_t ticket) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(ticket);
  if (it == s.entries.end()) return;
  if (!it->second.started) --s.unstarted;
  if (!it->second.started && it->second.wanted) --s.wanted;
  if (it->second.counted && !it->second.taken) --s.ahead;
  s.entries.erase(it);
  Schedule(state_);
}

void ChunkPipeline::Cancel() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.cancelled = true;
  s.stop = true;  // no further parse jobs start; the destructor still waits for running ones
  s.done_cv.notify_all();
}

uint64_t ChunkPipeline::chunks_parsed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->chunks_parsed;
}

double ChunkPipeline::parse_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->parse_seconds;
}

}  // namespace conveyor
