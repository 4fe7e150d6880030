#include "proto/stream_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"

namespace conveyor {
namespace {

absl::Status Violation(const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("the daemon sent ", what)); }

}  // namespace

uint64_t StreamReader::segment_bytes(uint32_t id) const {
  auto it = segments_.find(id);
  return it == segments_.end() ? 0 : it->second;
}

uint64_t StreamReader::cuda_segment_bytes(uint32_t id) const {
  auto it = cuda_segments_.find(id);
  return it == cuda_segments_.end() ? 0 : it->second;
}

absl::StatusOr<StreamReader::Event> StreamReader::Feed(v1::StreamResponse message) {
  return Feed(std::move(message), nullptr);
}

absl::StatusOr<StreamReader::Event> StreamReader::Feed(v1::StreamResponse message, const PartBytes* part) {
  if (!broken_.ok()) return broken_;
  auto event = Take(std::move(message), part);
  if (!event.ok()) broken_ = event.status();
  return event;
}

absl::Status StreamReader::Finished() const {
  if (!broken_.ok()) return broken_;
  if (assembling_) {
    return Violation(absl::StrCat("an OK end of the call in the middle of batch ", batch_.descriptor.serial(), " (",
                                  parts_left_, " of its parts missing)"));
  }
  if (!ended_) return Violation("an OK end of the call without an end-of-stream message");
  return absl::OkStatus();
}

absl::StatusOr<StreamReader::Event> StreamReader::Take(v1::StreamResponse m, const PartBytes* part) {
  if (part != nullptr) {
    const v1::InlinePayload* p = m.has_batch() ? &m.batch().payload() : m.has_more() ? &m.more().payload() : nullptr;
    if (p == nullptr || !p->data().empty()) return absl::InternalError("inline bytes given outside a message that carries them");
  }
  if (ended_) return Violation("a message after the end of the stream");
  if (assembling_ && !m.has_more()) {
    return Violation(absl::StrCat("another message in the middle of batch ", batch_.descriptor.serial(), " (",
                                  parts_left_, " of its parts missing)"));
  }
  switch (m.kind_case()) {
    case v1::StreamResponse::kMore:
      return AddPart(m.more(), part);
    case v1::StreamResponse::kBatch:
      return BeginBatch(m.mutable_batch(), part);
    case v1::StreamResponse::kEnd:
      if (m.end().batches() != next_serial_) {
        return Violation(absl::StrCat("an end of stream counting ", m.end().batches(), " batches after ",
                                      next_serial_, " were received"));
      }
      if (m.end().cursor().size() > limits_.max_cursor_bytes) return Violation("an end-of-stream cursor too long to resume with");
      end_ = std::move(*m.mutable_end());
      ended_ = true;
      return Event::kEnd;
    case v1::StreamResponse::kSegment: {
      const v1::SharedMemorySegment& s = m.segment();
      if (s.token().size() != 16 || s.bytes() == 0 || s.fd_socket().empty() || s.fd_socket().size() >= 108) {
        return Violation("a malformed shared-memory segment announcement");
      }
      if (s.bytes() > limits_.max_segment_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("the daemon announced a segment of ", s.bytes(),
                                                         " bytes, more than the client's limit of ",
                                                         limits_.max_segment_bytes));
      }
      if (!segments_.emplace(s.id(), s.bytes()).second) {
        return Violation(absl::StrCat("shared-memory segment ", s.id(), " twice"));
      }
      segment_ = std::move(*m.mutable_segment());
      return Event::kSegment;
    }
    case v1::StreamResponse::kCudaSegment: {
      const v1::CudaIpcSegment& s = m.cuda_segment();
      if (s.handle().size() != 64 || s.device_uuid().size() != 16 || s.bytes() == 0) {
        return Violation("a malformed CUDA IPC segment announcement");
      }
      if (s.bytes() > limits_.max_segment_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat("the daemon announced a device block of ", s.bytes(),
                                                         " bytes, more than the client's limit of ",
                                                         limits_.max_segment_bytes));
      }
      if (!cuda_segments_.emplace(s.id(), s.bytes()).second) {
        return Violation(absl::StrCat("CUDA IPC segment ", s.id(), " twice"));
      }
      cuda_segment_ = std::move(*m.mutable_cuda_segment());
      return Event::kCudaSegment;
    }
    case v1::StreamResponse::KIND_NOT_SET:
      break;
  }
  return Violation("an empty message");
}

absl::StatusOr<StreamReader::Event> StreamReader::BeginBatch(v1::BatchDescriptor* d, const PartBytes* part) {
  if (d->serial() != next_serial_) {
    return Violation(absl::StrCat("batch serial ", d->serial(), " where ", next_serial_,
                                  " was due (a duplicate, a gap or a reordering)"));
  }
  const uint64_t total = d->total_bytes();
  if (total > limits_.max_batch_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("batch ", d->serial(), " claims ", total,
                                                     " bytes, more than the client's limit of ", limits_.max_batch_bytes));
  }
  if (d->cursor().size() > limits_.max_cursor_bytes) return Violation(absl::StrCat("batch ", d->serial(), " with a cursor too long to resume with"));
  const int places = int{d->has_shm()} + int{d->has_cuda_ipc()} + int{d->parts() > 0};
  if (places != 1) {
    return Violation(absl::StrCat("batch ", d->serial(), " with ", places == 0 ? "no" : "more than one",
                                  " place for its bytes (inline parts, shared memory, CUDA IPC)"));
  }
  batch_ = ReceivedBatch();
  batch_.bytes = std::move(*d->mutable_payload()->mutable_data());
  // The first part's size; its bytes are appended below once they are known to fit.
  const uint64_t first = part != nullptr ? part->size() : batch_.bytes.size();
  const uint64_t offset = d->payload().offset();
  d->clear_payload();
  batch_.descriptor = std::move(*d);
  const v1::BatchDescriptor& b = batch_.descriptor;
  auto plan = DescriptorToPlan(b);
  if (!plan.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", b.serial(), ": ", plan.status().message()));
  }
  batch_.plan = std::move(*plan);
  if (b.has_shm() || b.has_cuda_ipc()) {
    if (first > 0) return Violation(absl::StrCat("inline bytes with batch ", b.serial(), ", which is in a segment"));
    const bool device = b.has_cuda_ipc();
    const uint32_t id = device ? b.cuda_ipc().segment() : b.shm().segment();
    const uint64_t at = device ? b.cuda_ipc().offset() : b.shm().offset();
    const uint64_t size = device ? cuda_segment_bytes(id) : segment_bytes(id);
    if (size == 0 || at > size || total > size - at) {
      return Violation(absl::StrCat("batch ", b.serial(), " outside its ", device ? "CUDA IPC" : "shared-memory",
                                    " segment ", id));
    }
    ++next_serial_;
    return Event::kBatch;
  }
  // Inline: every part holds at least one byte (an empty batch is one empty part).
  if (offset != 0 || b.parts() > std::max<uint64_t>(total, 1) || first > total ||
      (b.parts() == 1) != (first == total) || (total > 0 && first == 0)) {
    return Violation(absl::StrCat("batch ", b.serial(), " whose first part (", first, " bytes of ",
                                  total, ", ", b.parts(), " parts) does not fit"));
  }
  parts_left_ = b.parts() - 1;
  // Grown as parts arrive (never allocated up front to a size only claimed).
  if (part != nullptr) {
    batch_.bytes.reserve(parts_left_ == 0 ? first : std::min<uint64_t>(total, uint64_t{64} << 20));
    part->AppendTo(&batch_.bytes);
  }
  if (parts_left_ == 0) return Complete();
  batch_.bytes.reserve(std::min<uint64_t>(total, uint64_t{64} << 20));
  assembling_ = true;
  return Event::kNeedMore;
}

absl::StatusOr<StreamReader::Event> StreamReader::AddPart(const v1::MoreBytes& more, const PartBytes* part) {
  if (!assembling_) return Violation(absl::StrCat("a part of batch ", more.serial(), " with no batch begun"));
  const v1::BatchDescriptor& b = batch_.descriptor;
  const std::string& data = more.payload().data();
  const uint64_t size = part != nullptr ? part->size() : data.size();
  const uint64_t total = b.total_bytes(), have = batch_.bytes.size();
  if (more.serial() != b.serial() || more.payload().offset() != have || size == 0 || size > total - have ||
      (parts_left_ == 1) != (size == total - have)) {
    return Violation(absl::StrCat("a part (batch ", more.serial(), ", offset ", more.payload().offset(), ", ",
                                  size, " bytes) out of order for batch ", b.serial(), " (", have, " of ",
                                  total, " bytes, ", parts_left_, " parts to come)"));
  }
  if (part != nullptr) {
    part->AppendTo(&batch_.bytes);
  } else {
    batch_.bytes.append(data);
  }
  if (--parts_left_ > 0) return Event::kNeedMore;
  assembling_ = false;
  return Complete();
}

absl::StatusOr<StreamReader::Event> StreamReader::Complete() {
  assembling_ = false;
  absl::Status valid =
      ValidateBatchBytes(batch_.plan, {reinterpret_cast<const std::byte*>(batch_.bytes.data()), batch_.bytes.size()});
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("batch ", batch_.descriptor.serial(), ": ", valid.message()));
  ++next_serial_;
  return Event::kBatch;
}

}  // namespace conveyor
