#include "common/sampling/parser_pool.h"

#include <algorithm>

namespace conveyor {

ParserPool::ParserPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
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
