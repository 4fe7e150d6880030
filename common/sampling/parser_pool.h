// parser_pool.h: a fixed set of parser threads shared by many chunk pipelines (the
// daemon's subscriptions), so that parsing CPU is bounded by configuration however many
// trainers subscribe. Jobs run in submission order; a pipeline submits at most its own
// thread budget of jobs at a time, each job parsing one chunk, so pipelines take turns.
// Threads with no chunk to parse help assemble batches (AssemblyHelpers): a loader lends its
// pool to its assembler, which splits a batch over the threads idle at the time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/batch/assembler.h"

namespace conveyor {

class ParserPool final : public AssemblyHelpers {
 public:
  // Starts `threads` (>= 1) threads.
  explicit ParserPool(int threads);
  // Runs the jobs already submitted, then joins the threads.
  ~ParserPool() override;
  ParserPool(const ParserPool&) = delete;
  ParserPool& operator=(const ParserPool&) = delete;

  void Submit(std::function<void()> job) override;
  int threads() const { return static_cast<int>(threads_.size()); }
  // Jobs waiting for a thread, and threads busy (for metrics).
  size_t queued() const;
  size_t busy() const;

  // AssemblyHelpers: threads neither running a job nor owed one.
  int idle() const override;

 private:
  void Run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t busy_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor
