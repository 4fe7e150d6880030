#include "server/transports/pooled_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

struct PooledDestination final : Transport::Destination {
  uint32_t segment = 0;
  uint64_t offset = 0;
};

}  // namespace

PooledTransport::~PooledTransport() {
  std::map<uint32_t, std::unique_ptr<Segment>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(segments_);
  }
  all.clear();  // outside the lock: unmapping and freeing device memory take time
}

absl::StatusOr<std::unique_ptr<PooledTransport::Segment>> PooledTransport::NewSegment(
    uint32_t id, uint64_t bytes, v1::StreamResponse* announcement) {
  // Slots with headroom over this batch, 256-byte aligned so that arrays inside keep their
  // alignment, and no more than the subscription's budget allows for `credits` of them.
  const uint64_t need = (bytes + 255) / 256 * 256;
  const uint64_t want = static_cast<uint64_t>(options_.slot_headroom * static_cast<double>(bytes));
  uint64_t slot = std::max<uint64_t>(options_.min_slot_bytes,
                                     (std::max<uint64_t>(want, need) + 255) / 256 * 256);
  const uint64_t fits = options_.subscription_bytes / credits_ / 256 * 256;
  slot = std::max(need, std::min(slot, fits));
  auto seg = std::make_unique<Segment>();
  seg->id = id;
  const uint64_t total = slot * credits_;
  if (in_flight_ != nullptr) {
    absl::Status st = in_flight_->Reserve(total, absl::StrCat("a segment of ", total, " bytes"));
    if (!st.ok()) return st;
    seg->reservation = Reservation(in_flight_, total);
  }
  auto pool = MakeSegment(id, slot, credits_, announcement);
  if (!pool.ok()) return pool.status();
  seg->pool = std::move(*pool);
  return seg;
}

absl::StatusOr<std::unique_ptr<Transport::Destination>> PooledTransport::ReserveChecked(
    uint64_t serial, uint64_t bytes) {
  auto d = std::make_unique<PooledDestination>();
  d->serial = serial;
  bool need_segment = false;
  {
    absl::MutexLock lock(&mu_);
    need_segment = segments_.empty() || segments_.rbegin()->second->pool->slot_bytes() < bytes;
  }
  if (need_segment) {
    // Made without the lock (memfd, sealing, device memory take time); only this thread
    // adds segments.
    v1::StreamResponse announcement;
    auto made = NewSegment(next_id_, bytes, &announcement);
    if (!made.ok()) return made.status();
    ++next_id_;
    d->announcements.push_back(std::move(announcement));
    absl::MutexLock lock(&mu_);
    segments_[(*made)->id] = std::move(*made);
  }
  std::vector<std::unique_ptr<Segment>> idle;
  {
    absl::MutexLock lock(&mu_);
    Segment& seg = *segments_.rbegin()->second;
    std::optional<gpu::Slot> slot = seg.pool->TryAcquire();
    if (!slot) return absl::InternalError("no free shared-memory slot (credits exceed slots)");
    slot_of_serial_[serial] = {seg.id, slot->index};
    d->segment = seg.id;
    d->offset = uint64_t{slot->index} * seg.pool->slot_bytes();
    d->bytes = absl::MakeSpan(slot->data, bytes);
    idle = TakeIdleLocked();
  }
  idle.clear();  // unmapped and given back to the budget; a client's own mapping stays valid
  return d;
}

void PooledTransport::Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                               std::vector<OutgoingMessage>* out) {
  auto* d = static_cast<PooledDestination*>(destination.get());
  for (auto& a : d->announcements) out->push_back(OutgoingMessage{std::move(a), nullptr, 0, 0, nullptr});
  Locate(d->segment, d->offset, first.mutable_batch());
  out->push_back(OutgoingMessage{std::move(first), nullptr, 0, 0, nullptr});
}

void PooledTransport::Release(uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = slot_of_serial_.find(serial);
  if (it == slot_of_serial_.end()) return;
  auto seg = segments_.find(it->second.first);
  if (seg != segments_.end()) (void)seg->second->pool->Release(it->second.second);
  slot_of_serial_.erase(it);
}

std::vector<std::unique_ptr<PooledTransport::Segment>> PooledTransport::TakeIdleLocked() {
  std::vector<std::unique_ptr<Segment>> idle;
  if (segments_.size() < 2 || !releases_idle_segments()) return idle;
  const uint32_t newest = segments_.rbegin()->first;
  for (auto it = segments_.begin(); it != segments_.end();) {
    const gpu::SlotPool& pool = *it->second->pool;
    if (it->first != newest && pool.free_slots() == pool.slots()) {
      idle.push_back(std::move(it->second));
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  return idle;
}

size_t PooledTransport::segments() const {
  absl::MutexLock lock(&mu_);
  return segments_.size();
}

uint64_t PooledTransport::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, seg] : segments_) total += seg->pool->slot_bytes() * seg->pool->slots();
  return total;
}

}  // namespace conveyor
