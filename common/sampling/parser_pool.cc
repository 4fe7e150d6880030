#include "common/sampling/parser_pool.h"

#include <sched.h>

#include <algorithm>

namespace conveyor {
namespace {

// The cores this process may run on: its affinity mask (taskset, a cpuset), else the machine's.
int ProcessCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

ParserPool::ParserPool(int threads, int cores) {
  threads = std::max(1, threads);
  spare_cores_ = (cores > 0 ? cores : ProcessCores()) >= threads + 2;
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

void ParserPool::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

size_t ParserPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

size_t ParserPool::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

int ParserPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t owed = busy_ + jobs_.size();
  return owed >= threads_.size() ? 0 : static_cast<int>(threads_.size() - owed);
}

void ParserPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    ++busy_;
    lock.unlock();
    job();
    lock.lock();
    --busy_;
  }
}

}  // namespace conveyor
