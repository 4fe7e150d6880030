// batch_slots.h: where a shared-memory or CUDA IPC subscription's batches are assembled:
// segments (memfd segments, or blocks of device memory) of `credits` equal slots. A batch
// takes a free slot of the newest segment; a batch that outgrows it gets a new segment,
// announced to the client before the batch. An acknowledged batch frees its slot, and an
// older segment whose slots are all free is released (the client keeps its own mapping as
// long as it wants). Every segment's bytes are reserved from the daemon's budget for
// batches in flight while it exists, and `credits` slots must fit the subscription's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "server/memory_budget.h"
#include "server/shared_memory.h"

namespace conveyor {

struct BatchSlotsOptions {
  bool device = false;           // CUDA IPC blocks on `cuda_device`; else memfd segments
  int cuda_device = 0;
  uint32_t credits = 1;          // slots per segment
  uint64_t min_slot_bytes = 256;
  double slot_headroom = 1.0;    // a new segment's slots hold this x the batch that made it
  uint64_t subscription_bytes = UINT64_MAX;  // a segment is at most this (slots shrink to fit)
  MemoryBudget* in_flight = nullptr;         // the daemon's budget; not owned
  FdServer* fd_server = nullptr;             // memfd segments: hands descriptors out; not owned
};

class BatchSlots {
 public:
  explicit BatchSlots(const BatchSlotsOptions& options) : options_(options) {}
  // Forgets every token and frees every segment (and its budget).
  ~BatchSlots();
  BatchSlots(const BatchSlots&) = delete;
  BatchSlots& operator=(const BatchSlots&) = delete;

  struct Slot {
    uint32_t segment = 0;
    uint64_t offset = 0;
    std::byte* data = nullptr;  // host (memfd) or device address
  };
  // A free slot of at least `bytes` for batch `serial`. A new segment's announcement is
  // appended to `announcements`. Errors: ResourceExhausted (the daemon's budget, memfd or
  // device memory), Internal (sealing, tokens, IPC export). Called by one thread at a time.
  absl::StatusOr<Slot> Take(uint64_t serial, uint64_t bytes, std::vector<v1::StreamResponse>* announcements);
  // Batch `serial` is done with (acknowledged, or never to be sent). Thread-safe; never
  // blocks for longer than a map update (segments are freed by the next Take()).
  void Free(uint64_t serial);
  // Segments alive and their bytes (tests, metrics).
  size_t segments() const;
  uint64_t bytes() const;

 private:
  struct Segment {
    uint32_t id = 0;
    std::shared_ptr<ShmSegment> shm;
    std::shared_ptr<void> device;
    uint64_t slot_bytes = 0;
    uint64_t total_bytes = 0;
    std::vector<uint32_t> free_slots;
    std::string token;
    Reservation reservation;
  };
  absl::StatusOr<std::unique_ptr<Segment>> MakeSegment(uint64_t bytes, v1::StreamResponse* announcement);
  // Segments other than the newest with every slot free (mu_ held): taken out to be freed.
  std::vector<std::unique_ptr<Segment>> TakeIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(std::vector<std::unique_ptr<Segment>> idle);

  const BatchSlotsOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint32_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);  // by id; last is newest
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> slot_of_serial_ ABSL_GUARDED_BY(mu_);
  uint32_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace conveyor
