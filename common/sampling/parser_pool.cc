#include "common/sampling/parser_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace conveyor {
namespace {

// Whole CPUs of this process's cgroup quota (v2 cpu.max, else v1's cfs quota and period), or
// 0 when it has none.
int CgroupCpus() {
  double quota = -1, period = 0;
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  std::string q;
  if (v2 >> q >> period) {
    if (q == "max") return 0;
    quota = std::atof(q.c_str());
  } else {
    std::ifstream qf("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), pf("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!(qf >> quota) || !(pf >> period)) return 0;
  }
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, static_cast<int>(quota / period));
}

// The cores this process may run on: its affinity mask (taskset, a cpuset), else the machine's,
// at most its cgroup's CPU quota (docker --cpus, a Kubernetes limit).
int ProcessCores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  if (const int quota = CgroupCpus(); quota > 0) cores = std::min(cores, quota);
  return cores;
}

}  // namespace

ParserPool::ParserPool(int threads, int cores, bool shared) {
  threads = std::max(0, threads);
  spare_cores_ = !shared && (cores > 0 ? cores : ProcessCores()) >= threads + 2;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

ParserPool::~ParserPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ParserPool::Submit(std::function<void()> job) { Add(std::move(job), /*helping=*/false); }

void ParserPool::Help(std::function<void()> job) { Add(std::move(job), /*helping=*/true); }

void ParserPool::Add(std::function<void()> job, bool helping) {
  if (threads_.empty()) {  // no thread to run it: the caller does (ChunkPipeline submits none)
    job();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{std::move(job), helping});
    if (!helping) ++parse_queued_;
  }
  cv_.notify_one();
}

size_t ParserPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parse_queued_;
}

size_t ParserPool::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parse_busy_;
}

int ParserPool::Unowed(size_t owed) const {
  return owed >= threads_.size() ? 0 : static_cast<int>(threads_.size() - owed);
}

int ParserPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Unowed(busy_ + jobs_.size());
}

int ParserPool::available() const {
  if (spare_cores_) return threads();
  return unowed();
}

int ParserPool::unowed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Unowed(parse_queued_ + parse_busy_);
}

void ParserPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    ++busy_;
    if (!job.helping) {
      --parse_queued_;
      ++parse_busy_;
    }
    lock.unlock();
    job.run();
    job.run = nullptr;  // (what it holds goes before the count says it is done)
    lock.lock();
    --busy_;
    if (!job.helping) --parse_busy_;
  }
}

}  // namespace conveyor
