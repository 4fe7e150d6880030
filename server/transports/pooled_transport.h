// pooled_transport.h: the transports whose batches stay where they were assembled and
// travel as a segment and an offset (shared memory, CUDA IPC). Their memory is segments of
// `credits` equal slots, each segment a gpu::SlotPool. A batch takes a free slot of the
// newest segment; a batch that outgrows its slots gets a new segment, announced to the
// client before the batch. An acknowledged batch frees its slot, and an older segment whose
// slots are all free is released where the kind allows it (the client keeps its own mapping
// as long as it wants). Every segment's bytes are reserved from the daemon's budget for
// batches in flight while it exists, and `credits` slots must fit the subscription's budget.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cuda/slot_pool.h"
#include "server/transports/transport.h"

namespace conveyor {

class PooledTransport : public Transport {
 public:
  // Forgets and frees every segment (and gives back its budget).
  ~PooledTransport() override;
  void Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                std::vector<OutgoingMessage>* out) override;
  void Release(uint64_t serial) override;
  // Segments alive and their bytes (tests, metrics).
  size_t segments() const;
  uint64_t bytes() const;

 protected:
  explicit PooledTransport(const TransportEnv& env) : Transport(env) {}
  // A segment's slots over new memory: `slots` x `slot_bytes` (a multiple of 256), and
  // `announcement` set to the message that tells the client of segment `id`. Errors:
  // ResourceExhausted (memory), Internal (sealing, tokens, IPC export).
  virtual absl::StatusOr<std::unique_ptr<gpu::SlotPool>> MakeSegment(
      uint32_t id, uint64_t slot_bytes, uint32_t slots, v1::StreamResponse* announcement) = 0;
  // Says in the batch's descriptor where it lies.
  virtual void Locate(uint32_t segment, uint64_t offset, v1::BatchDescriptor* descriptor) const = 0;
  // Whether a segment may be freed before the stream ends once all its slots are free.
  virtual bool releases_idle_segments() const = 0;

 private:
  struct Segment {
    uint32_t id = 0;
    Reservation reservation;              // of the daemon's budget, while the segment exists
    std::unique_ptr<gpu::SlotPool> pool;  // freed before its reservation is given back
  };
  absl::StatusOr<std::unique_ptr<Destination>> ReserveChecked(uint64_t serial,
                                                              uint64_t bytes) override;
  absl::StatusOr<std::unique_ptr<Segment>> NewSegment(uint32_t id, uint64_t bytes,
                                                      v1::StreamResponse* announcement);
  // Segments other than the newest with every slot free (mu_ held): taken out to be freed.
  std::vector<std::unique_ptr<Segment>> TakeIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint32_t, std::unique_ptr<Segment>> segments_
      ABSL_GUARDED_BY(mu_);  // by id; last is newest
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> slot_of_serial_ ABSL_GUARDED_BY(mu_);
  uint32_t next_id_ = 0;  // the producer's alone
};

}  // namespace conveyor
