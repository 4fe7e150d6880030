// A BatchAssembler that runs another's Assemble() on a worker thread, in the order begun,
// so that the caller's thread can plan batch k+1 while batch k is copied.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"

namespace conveyor {
namespace {

class PipelinedAssembler final : public BatchAssembler {
 public:
  explicit PipelinedAssembler(std::unique_ptr<BatchAssembler> inner) : inner_(std::move(inner)) {
    worker_ = std::thread([this] { Work(); });
  }
  ~PipelinedAssembler() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();  // finishes what was begun: its destinations may still be read
  }

  const char* name() const override { return inner_->name(); }
  bool pipelined() const override { return true; }
  void set_helpers(AssemblyHelpers* helpers) override { inner_->set_helpers(helpers); }

  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) override {
    auto fence = Begin(plan, pieces, dst);
    if (!fence.ok()) return fence.status();
    return Wait(*fence);
  }

  absl::StatusOr<uint64_t> Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                 absl::Span<std::byte> dst) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{++begun_, &plan, pieces, dst});
    cv_.notify_all();
    return begun_;
  }

  absl::Status Wait(uint64_t fence) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (fence == 0 || fence > begun_) return absl::InvalidArgumentError(absl::StrCat("no batch was begun as fence ", fence));
    done_cv_.wait(lock, [&] { return done_ >= fence; });
    auto it = failed_.find(fence);
    if (it == failed_.end()) return absl::OkStatus();
    absl::Status st = std::move(it->second);
    failed_.erase(it);
    return st;
  }

 private:
  struct Job {
    uint64_t fence;
    const BatchPlan* plan;
    absl::Span<const PieceRef> pieces;
    absl::Span<std::byte> dst;
  };

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      Job job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      absl::Status st = inner_->Assemble(*job.plan, job.pieces, job.dst);
      lock.lock();
      if (!st.ok()) failed_[job.fence] = std::move(st);
      done_ = job.fence;
      done_cv_.notify_all();
    }
  }

  const std::unique_ptr<BatchAssembler> inner_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  std::map<uint64_t, absl::Status> failed_;
  uint64_t begun_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace

std::unique_ptr<BatchAssembler> MakePipelinedAssembler(std::unique_ptr<BatchAssembler> inner) {
  return std::make_unique<PipelinedAssembler>(std::move(inner));
}

}  // namespace conveyor
