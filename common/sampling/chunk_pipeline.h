// chunk_pipeline.h: parser threads that parse chunks ahead of the consumer, in the order the
// consumer will need them. The consumer enqueues chunk ids in order of use and gets a ticket
// for each; workers parse at most `prefetch` chunks beyond those the consumer has taken;
// Get(ticket) waits for its chunk; Release(ticket) drops it (unless keep_all, which keeps
// every parsed chunk for later epochs, CNTK's keepDataInMemory). Parsing runs on a
// ParserPool: the daemon's shared one, or one the pipeline owns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/parsed_chunk.h"
#include "common/dataset/dataset.h"
#include "common/sampling/parser_pool.h"

namespace conveyor {

struct ChunkPipelineOptions {
  int threads = 1;    // chunks parsed at once, >= 1 (threads of its own pool, if it owns one)
  int prefetch = 2;   // chunks parsed ahead of the consumer, >= 1
  bool keep_all = false;
  ParserPool* pool = nullptr;  // shared threads (must outlive the pipeline); nullptr: own pool
  // With its own pool only: the consumer's thread is one of the `threads`. The pool gets
  // threads - 1 (none for 1), and a Get() that would wait parses on the consumer's thread
  // instead: its own chunk if no job has started it, else, once the first chunk is done and
  // when the chunk it waits for has more than half an average parse still to go, the next
  // chunk not yet started within the parse-ahead (a wait shorter than that is cheaper than
  // a whole chunk's parse on the thread that plans and assembles). So `threads` threads in
  // all parse, plan and assemble (`conveyor bench --threads N` uses N cores at most), where
  // the consumer's thread would otherwise come on top of them.
  bool consumer_parses = false;
  // Asked before a chunk is parsed (not for one kept in memory): an error (e.g. a memory
  // budget's ResourceExhausted) becomes that chunk's error instead of parsing it. Called on
  // a parser thread; must be thread-safe and quick.
  std::function<absl::Status(uint64_t chunk_id)> admit;
};

class ChunkPipeline {
 public:
  // `dataset` must outlive the pipeline.
  ChunkPipeline(const Dataset* dataset, const ChunkPipelineOptions& options);
  // Stops; waits for the chunks being parsed for it.
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // Schedules `chunk_id`; returns its ticket (tickets count up from 0).
  uint64_t Enqueue(uint64_t chunk_id);
  // Waits for the ticket's chunk. A chunk waited for that no job has started is parsed next,
  // even when `prefetch` chunks parsed ahead are not taken yet (the consumer may take tickets
  // out of order: a prefetched chunk its next batches do not use must not stall it); with
  // consumer_parses, on the calling thread.
  // Errors: the parse error (DataLoss beyond maxErrors); Cancelled once Cancel() was called.
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> Get(uint64_t ticket);
  // Thread-safe: wakes every Get() with Cancelled and starts no more parses (those running
  // finish their chunk).
  void Cancel();
  // The consumer is done with the ticket.
  void Release(uint64_t ticket);

  // The threads parsing for it (its own or the shared ones).
  ParserPool* pool() const { return state_->pool; }

  // Chunks parsed so far and seconds spent parsing (all threads): parses this pipeline
  // caused, not chunks the dataset's cache already held (the next sweep's entry of a chunk
  // the end of this sweep still holds, or another reader's) or parsed for a concurrent call.
  uint64_t chunks_parsed() const;
  double parse_seconds() const;

 private:
  struct Entry {
    uint64_t chunk = 0;
    bool started = false, done = false, taken = false, counted = false;
    bool wanted = false;  // Get() waits for it: parsed next, past the parse-ahead budget
    std::chrono::steady_clock::time_point started_at;  // when a parse of it began
    absl::Status status;
    std::shared_ptr<const ParsedChunk> data;
  };
  // Everything a parse job touches. Jobs hold it by shared_ptr, so that a job still queued
  // in a shared pool when the pipeline goes away finds `stop` and returns without touching
  // the pipeline or the dataset: the destructor waits only for jobs already parsing.
  struct State {
    const Dataset* dataset = nullptr;
    ChunkPipelineOptions options;
    ParserPool* pool = nullptr;
    std::mutex mu;
    std::condition_variable done_cv, idle_cv;
    std::map<uint64_t, Entry> entries;  // by ticket
    std::map<uint64_t, std::shared_ptr<const ParsedChunk>> kept;  // by chunk id (keep_all)
    uint64_t next_ticket = 0;
    uint64_t ahead = 0;      // started or done, not yet taken
    uint64_t unstarted = 0;  // entries no job has started
    uint64_t wanted = 0;     // of those, entries a Get() waits for
    uint64_t jobs = 0;       // jobs submitted and not finished
    uint64_t unclaimed = 0;  // of those, not yet running
    uint64_t parsing = 0;    // of those, parsing a chunk now
    uint64_t chunks_parsed = 0;
    double parse_seconds = 0;
    bool first_done = false;  // a job has finished a chunk (parsed, failed or refused)
    bool stop = false;
    bool cancelled = false;
  };
  // Submits parse jobs while there is work, room ahead and thread budget (mu held).
  static void Schedule(const std::shared_ptr<State>& s);
  // One job: parses the first unstarted chunk, if any.
  static void RunJob(const std::shared_ptr<State>& s);
  // The entry a parse should take next (mu held): the first chunk waited for, else the first
  // not started (the order of use), within the parse-ahead; null when there is none.
  static std::map<uint64_t, Entry>::iterator Claimable(State& s);
  // Parses the entry `it` on this thread (mu held by `lock`, released while parsing).
  static void Parse(State& s, std::unique_lock<std::mutex>& lock, std::map<uint64_t, Entry>::iterator it);

  std::unique_ptr<ParserPool> own_pool_;
  std::shared_ptr<State> state_;
};

}  // namespace conveyor
