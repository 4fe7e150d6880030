// parser_pool.h: a fixed set of parser threads shared by many chunk pipelines (the
// daemon's subscriptions), so that parsing CPU is bounded by configuration however many
// trainers subscribe. Jobs run in submission order; a pipeline submits at most its own
// thread budget of jobs at a time, each job parsing one chunk, so pipelines take turns.
// Threads with no chunk to parse help assemble batches (AssemblyHelpers): a loader lends its
// pool to its assembler, which splits a batch over the threads available at the time: those
// owed no chunk to parse (idle, or busy assembling an earlier batch: jobs run in order, so
// such a thread takes this batch's ranges next), or, where the process has a core for every
// pool thread and two more (the loader's thread and one for the rest), all of them: a thread
// busy parsing then takes its ranges once its chunk is done, while the loader's thread goes
// on planning the next batch instead of assembling this one alone. On a 16-core machine that
// lifted `--threads 2` over `--threads 1` for CBF from 1.07 to 1.43-1.47x and Kaldi CM at 4
// threads from 1.17 to 2.40x (bench/RESULTS.md); where cores are short (2 cores, 2 threads)
// offering threads busy parsing cost 20-30%, hence not there. Counting a thread that is
// assembling the batch before as free (it was not, before 2026-11-29) gives it every batch
// instead of every other one when the loader plans two ahead.
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
  // Starts `threads` threads. A pool of none (a loader whose own thread is its only one,
  // `--threads 1`) runs what it is given on the calling thread. `cores`: the cores this
  // process may run on, which decide available() (0: its CPU affinity mask,
  // sched_getaffinity, capped by its cgroup's CPU quota, cpu.max). `shared`: a pool many loaders use (the daemon's), whose threads busy
  // parsing are never offered: its subscriptions' loader threads need the spare cores. (A
  // thread assembling is offered there too: another subscription's ranges queued behind it
  // cost that subscription nothing, its loader's thread running whatever is still untaken.)
  explicit ParserPool(int threads, int cores = 0, bool shared = false);
  // Runs the jobs already submitted, then joins the threads.
  ~ParserPool() override;
  ParserPool(const ParserPool&) = delete;
  ParserPool& operator=(const ParserPool&) = delete;

  // A parse job (or any work that is not a batch's assembly).
  void Submit(std::function<void()> job);
  // AssemblyHelpers: a share of a batch's assembly.
  void Help(std::function<void()> job) override;
  int threads() const { return static_cast<int>(threads_.size()); }
  // Parse jobs waiting for a thread, and threads parsing (for metrics; assembly not counted).
  size_t queued() const;
  size_t busy() const;

  // AssemblyHelpers: threads neither running a job nor owed one.
  int idle() const override;
  // AssemblyHelpers: every thread when the process has cores to spare for all of them (at
  // least threads() + 2, and the pool not shared), else those owed no parse job (running or
  // queued): idle, or assembling.
  int available() const override;
  // Threads owed no parse job (running or queued): idle, or assembling, whatever the cores.
  // The helpers worth asking for work joined at once that one busy assembling may still take
  // (a batch's plan ranges: Loader::Begin), where those busy parsing would only queue a job.
  int unowed() const;

 private:
  struct Job {
    std::function<void()> run;
    bool helping = false;  // submitted through Help()
  };
  void Add(std::function<void()> job, bool helping);
  // Threads less `owed` (jobs running or queued that each need one), at least 0.
  int Unowed(size_t owed) const;
  void Run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  size_t busy_ = 0;          // threads running a job (of either kind)
  size_t parse_queued_ = 0;  // parse jobs waiting
  size_t parse_busy_ = 0;    // threads running one
  bool stop_ = false;
  bool spare_cores_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor
