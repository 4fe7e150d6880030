#include "server/memory_budget.h"

#include <malloc.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/huge_pages.h"

namespace conveyor {

MemoryBudget::MemoryBudget(std::string description, std::string key, uint64_t limit)
    : description_(std::move(description)), key_(std::move(key)), limit_(limit) {}

absl::Status MemoryBudget::Reserve(uint64_t bytes, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  const uint64_t left = limit_ - used_;
  if (bytes > left) {
    return absl::ResourceExhaustedError(absl::StrCat(description_, ", ", key_, " (", limit_, " bytes), has ", left,
                                                     " bytes left; ", what, " does not fit"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

void MemoryBudget::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes <= used_ ? bytes : used_;
}

uint64_t MemoryBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Reset();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

void Reservation::Reset() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Release(bytes_);
  bytes_ = 0;
}

uint64_t DefaultDaemonBudget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{8} << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

MemoryReleaser::MemoryReleaser() : thread_([this] { Run(); }) {}

MemoryReleaser::~MemoryReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MemoryReleaser::Request() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
}

void MemoryReleaser::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &MemoryReleaser::Woken));
      if (stop_) return;
      requested_ = false;
    }
    ReleaseFreedMemory();
  }
}

void ReleaseFreedMemory() {
  ::malloc_trim(0);
  ReleaseHugeBlocks();
}

}  // namespace conveyor
