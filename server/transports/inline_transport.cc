#include "server/transports/inline_transport.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

// An inline batch's memory: pages of its own (mmap), so that freeing it gives the memory
// back to the system at once. From malloc, a large buffer freed by a producer thread would
// stay in that thread's arena (the allocator is tuned to keep freed memory for reuse, and
// malloc_trim cannot shrink a thread arena's top). The gRPC slices that send a batch's
// parts hold its pages (and nothing else: they may outlive the stream, and the daemon's
// budget), until gRPC has written them.
struct InlinePages {
  InlinePages() = default;
  InlinePages(const InlinePages&) = delete;
  InlinePages& operator=(const InlinePages&) = delete;
  ~InlinePages() {
    if (data != nullptr) ::munmap(data, size);
  }
  std::byte* data = nullptr;
  uint64_t size = 0;
};

// The batch while the stream holds it: its pages and its share of the daemon's budget,
// until the write of its last part completes (or the stream drops it).
struct InlineBuffer {
  std::shared_ptr<InlinePages> pages;
  Reservation reservation;
};

struct InlineDestination final : Transport::Destination {
  std::shared_ptr<InlineBuffer> buffer;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport::Destination>> InlineTransport::ReserveChecked(
    uint64_t serial, uint64_t bytes) {
  absl::Status st = in_flight_->Reserve(bytes, absl::StrCat("a batch of ", bytes, " bytes"));
  if (!st.ok()) return st;
  auto d = std::make_unique<InlineDestination>();
  d->serial = serial;
  auto b = std::make_shared<InlineBuffer>();
  b->reservation = Reservation(in_flight_, bytes);
  const uint64_t mapped = std::max<uint64_t>(bytes, 1);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a batch of ", bytes, " bytes"));
  b->pages = std::make_shared<InlinePages>();
  b->pages->data = static_cast<std::byte*>(p);
  b->pages->size = mapped;
  d->bytes = absl::MakeSpan(b->pages->data, bytes);
  d->buffer = std::move(b);
  return d;
}

void InlineTransport::Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                               std::vector<OutgoingMessage>* out) {
  auto* d = static_cast<InlineDestination*>(destination.get());
  // Parts reference the one buffer (through `payload`, which shares its ownership); each
  // is sent from there (OutgoingMessage::Encode), its slice holding the pages.
  const std::shared_ptr<const std::byte> bytes(d->buffer, d->buffer->pages->data);
  const std::shared_ptr<const void> pages = d->buffer->pages;
  const uint64_t total = d->bytes.size();
  const uint64_t part = options_.inline_part_bytes;
  for (auto& a : d->announcements) out->push_back(OutgoingMessage{std::move(a), nullptr, 0, 0, nullptr});
  v1::BatchDescriptor* desc = first.mutable_batch();
  desc->set_parts(static_cast<uint32_t>(std::max<uint64_t>(1, (total + part - 1) / part)));
  desc->mutable_payload()->set_offset(0);
  out->push_back(OutgoingMessage{std::move(first), bytes, 0, std::min(part, total), pages});
  for (uint64_t off = part; off < total; off += part) {
    OutgoingMessage more;
    more.message.mutable_more()->set_serial(d->serial);
    more.message.mutable_more()->mutable_payload()->set_offset(off);
    more.payload = bytes;
    more.offset = off;
    more.size = std::min(part, total - off);
    more.memory = pages;
    out->push_back(std::move(more));
  }
}

}  // namespace conveyor
