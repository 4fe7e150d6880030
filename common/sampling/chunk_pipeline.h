// chunk_pipeline.h: parser threads that parse chunks ahead of the consumer, in the order the
// consumer will need them. The consumer enqueues chunk ids in order of use and gets a ticket
// for each; workers parse at most `prefetch` chunks beyond those the consumer has taken;
// Get(ticket) waits for its chunk; Release(ticket) drops it (unless keep_all, which keeps
// every parsed chunk for later epochs, CNTK's keepDataInMemory).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batch/parsed_chunk.h"
#include "common/dataset/dataset.h"

namespace conveyor {

struct ChunkPipelineOptions {
  int threads = 1;    // parser threads, >= 1
  int prefetch = 2;   // chunks parsed ahead of the consumer, >= 1
  bool keep_all = false;
};

class ChunkPipeline {
 public:
  // `dataset` must outlive the pipeline. Starts the threads.
  ChunkPipeline(const Dataset* dataset, const ChunkPipelineOptions& options);
  // Stops and joins the threads; chunks being parsed are finished first.
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // Schedules `chunk_id`; returns its ticket (tickets count up from 0).
  uint64_t Enqueue(uint64_t chunk_id);
  // Waits for the ticket's chunk. Errors: the parse error (DataLoss beyond maxErrors).
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> Get(uint64_t ticket);
  // The consumer is done with the ticket.
  void Release(uint64_t ticket);

  // Chunks parsed so far and seconds spent parsing (all threads).
  uint64_t chunks_parsed() const;
  double parse_seconds() const;

 private:
  struct Entry {
    uint64_t chunk = 0;
    bool started = false, done = false, taken = false, counted = false;
    absl::Status status;
    std::shared_ptr<const ParsedChunk> data;
  };
  void Worker();

  const Dataset* const dataset_;
  const ChunkPipelineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::map<uint64_t, Entry> entries_;  // by ticket
  std::map<uint64_t, std::shared_ptr<const ParsedChunk>> kept_;  // by chunk id (keep_all)
  uint64_t next_ticket_ = 0;
  uint64_t ahead_ = 0;  // started or done, not yet taken
  uint64_t chunks_parsed_ = 0;
  double parse_seconds_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor
