#include "server/batch_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "cuda/ipc.h"
#include "cuda/slot_pool.h"

namespace conveyor {

BatchSlots::~BatchSlots() {
  std::map<uint32_t, std::unique_ptr<Segment>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(segments_);
  }
  for (auto& [id, seg] : all) {
    if (!seg->token.empty()) options_.fd_server->Forget(seg->token);
  }
}

absl::StatusOr<std::unique_ptr<BatchSlots::Segment>> BatchSlots::MakeSegment(uint64_t bytes,
                                                                            v1::StreamResponse* announcement) {
  // Slots with headroom over this batch, 256-byte aligned so that arrays inside keep their
  // alignment, and no more than the subscription's budget allows for `credits` of them.
  const uint64_t need = (bytes + 255) / 256 * 256;
  const uint64_t want = static_cast<uint64_t>(options_.slot_headroom * static_cast<double>(bytes));
  uint64_t slot = std::max<uint64_t>(options_.min_slot_bytes, (std::max<uint64_t>(want, need) + 255) / 256 * 256);
  const uint64_t fits = options_.subscription_bytes / options_.credits / 256 * 256;
  slot = std::max(need, std::min(slot, fits));
  auto seg = std::make_unique<Segment>();
  seg->slot_bytes = slot;
  seg->total_bytes = slot * options_.credits;
  if (options_.in_flight != nullptr) {
    absl::Status st = options_.in_flight->Reserve(seg->total_bytes, absl::StrCat("a segment of ", seg->total_bytes, " bytes"));
    if (!st.ok()) return st;
    seg->reservation = Reservation(options_.in_flight, seg->total_bytes);
  }
  if (options_.device) {
    const int device = options_.cuda_device;
    auto block = gpu::AllocateMemory(gpu::MemoryKind::kDevice, seg->total_bytes, device);
    if (!block.ok()) return block.status();
    seg->device = std::shared_ptr<void>(*block, [device](void* p) { gpu::FreeMemory(gpu::MemoryKind::kDevice, p, device); });
    auto handle = gpu::ExportIpcHandle(seg->device.get(), device);
    if (!handle.ok()) return handle.status();
    auto uuid = gpu::DeviceUuid(device);
    if (!uuid.ok()) return uuid.status();
    v1::CudaIpcSegment* a = announcement->mutable_cuda_segment();
    a->set_bytes(seg->total_bytes);
    a->set_handle(*handle);
    a->set_device_uuid(*uuid);
    a->set_device(device);
  } else {
    auto shm = ShmSegment::Create(seg->total_bytes);
    if (!shm.ok()) return shm.status();
    seg->shm = *shm;
    auto token = options_.fd_server->Register(seg->shm);
    if (!token.ok()) return token.status();
    seg->token = *token;
    v1::SharedMemorySegment* a = announcement->mutable_segment();
    a->set_bytes(seg->shm->size());
    a->set_token(seg->token);
    a->set_fd_socket(options_.fd_server->path());
  }
  for (uint32_t i = options_.credits; i > 0; --i) seg->free_slots.push_back(i - 1);
  return seg;
}

absl::StatusOr<BatchSlots::Slot> BatchSlots::Take(uint64_t serial, uint64_t bytes,
                                                  std::vector<v1::StreamResponse>* announcements) {
  bool need_segment = false;
  {
    absl::MutexLock lock(&mu_);
    need_segment = segments_.empty() || segments_.rbegin()->second->slot_bytes < bytes;
  }
  if (need_segment) {
    // Made without the lock (memfd, sealing, device memory take time); only this thread
    // adds segments.
    v1::StreamResponse announcement;
    auto made = MakeSegment(bytes, &announcement);
    if (!made.ok()) return made.status();
    absl::MutexLock lock(&mu_);
    (*made)->id = next_id_++;
    if (announcement.has_cuda_segment()) announcement.mutable_cuda_segment()->set_id((*made)->id);
    if (announcement.has_segment()) announcement.mutable_segment()->set_id((*made)->id);
    announcements->push_back(std::move(announcement));
    segments_[(*made)->id] = std::move(*made);
  }
  std::vector<std::unique_ptr<Segment>> idle;
  Slot out;
  {
    absl::MutexLock lock(&mu_);
    Segment& seg = *segments_.rbegin()->second;
    if (seg.free_slots.empty()) return absl::InternalError("no free shared-memory slot (credits exceed slots)");
    const uint32_t slot = seg.free_slots.back();
    seg.free_slots.pop_back();
    slot_of_serial_[serial] = {seg.id, slot};
    out.segment = seg.id;
    out.offset = uint64_t{slot} * seg.slot_bytes;
    out.data = (seg.device ? static_cast<std::byte*>(seg.device.get()) : seg.shm->data()) + out.offset;
    idle = TakeIdleLocked();
  }
  Drop(std::move(idle));
  return out;
}

void BatchSlots::Free(uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = slot_of_serial_.find(serial);
  if (it == slot_of_serial_.end()) return;
  auto seg = segments_.find(it->second.first);
  if (seg != segments_.end()) seg->second->free_slots.push_back(it->second.second);
  slot_of_serial_.erase(it);
}

std::vector<std::unique_ptr<BatchSlots::Segment>> BatchSlots::TakeIdleLocked() {
  std::vector<std::unique_ptr<Segment>> idle;
  if (segments_.size() < 2) return idle;
  const uint32_t newest = segments_.rbegin()->first;
  for (auto it = segments_.begin(); it != segments_.end();) {
    // Device blocks stay until the stream ends: an importer may still have one open.
    if (it->first != newest && !it->second->device && it->second->free_slots.size() == options_.credits) {
      idle.push_back(std::move(it->second));
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  return idle;
}

void BatchSlots::Drop(std::vector<std::unique_ptr<Segment>> idle) {
  for (auto& seg : idle) {
    if (!seg->token.empty()) options_.fd_server->Forget(seg->token);
  }
  idle.clear();  // unmapped and given back to the budget; a client's own mapping stays valid
}

size_t BatchSlots::segments() const {
  absl::MutexLock lock(&mu_);
  return segments_.size();
}

uint64_t BatchSlots::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, seg] : segments_) total += seg->total_bytes;
  return total;
}

}  // namespace conveyor
