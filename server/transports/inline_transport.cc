#include "server/transports/inline_transport.h"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/slot_pool.h"

namespace conveyor {
namespace {

// An inline batch's memory: pages of their own (mmap), so that freeing them gives the
// memory back to the system at once. From malloc, a large buffer freed by a producer thread
// would stay in that thread's arena (the allocator is tuned to keep freed memory for reuse,
// and malloc_trim cannot shrink a thread arena's top). The gRPC slices that send a batch's
// parts hold its pages (and nothing else: they may outlive the stream, and the daemon's
// budget), until gRPC has written them; then the pages go back to the stream's pool.
struct Mapping {
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    locked.reset();  // before the pages go
    if (data != nullptr) ::munmap(data, size);
  }
  std::byte* data = nullptr;
  uint64_t size = 0;
  std::unique_ptr<gpu::HostRegistration> locked;  // page-locked for the CUDA assembler (or null)
};

}  // namespace

// The stream's idle mappings, reused by its next batches: mapping (and faulting in) 1.6 MB
// per batch, and unmapping it, cost the producer more than assembling it. At most `keep` (the
// subscription's credits) are kept, so that idle pages are bounded by the subscription's
// budget and an eighth (credits x any batch's size fit server.subscriptionBytes, checked
// at Reserve; a mapping is an eighth larger than its first batch); they are outside the
// daemon's budget for batches in flight, and unmapped with the transport (when the stream
// ends).
class InlineTransport::Pool {
 public:
  explicit Pool(size_t keep) : keep_(keep) {}
  // The smallest idle mapping of at least `bytes`, the one given back last among equals
  // (or null): the pages the kernel has just copied from are likely still in the cache, and
  // the assembler writes them again sooner than it could fetch colder ones.
  std::unique_ptr<Mapping> Take(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i]->size >= bytes && (best == idle_.size() || idle_[i]->size <= idle_[best]->size)) best = i;
    }
    if (best == idle_.size()) return nullptr;
    std::unique_ptr<Mapping> m = std::move(idle_[best]);
    idle_.erase(idle_.begin() + static_cast<ptrdiff_t>(best));
    return m;
  }
  // Keeps `m` for a later batch, or unmaps it (the smallest goes when there are too many).
  void Put(std::unique_ptr<Mapping> m) {
    std::unique_ptr<Mapping> drop;
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(m));
    if (idle_.size() > keep_) {
      auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                        [](const auto& a, const auto& b) { return a->size < b->size; });
      drop = std::move(*smallest);
      idle_.erase(smallest);
    }
  }
  size_t idle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_.size();
  }

 private:
  const size_t keep_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Mapping>> idle_;
};

namespace {

// A batch's pages while anything holds them; back to the pool after (if it is still there).
struct InlinePages {
  InlinePages(std::unique_ptr<Mapping> m, std::weak_ptr<InlineTransport::Pool> p)
      : mapping(std::move(m)), pool(std::move(p)) {}
  InlinePages(const InlinePages&) = delete;
  InlinePages& operator=(const InlinePages&) = delete;
  ~InlinePages() {
    if (auto p = pool.lock()) p->Put(std::move(mapping));
  }
  std::unique_ptr<Mapping> mapping;
  std::weak_ptr<InlineTransport::Pool> pool;
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

InlineTransport::InlineTransport(const TransportEnv& env)
    : Transport(env), pool_(std::make_shared<Pool>(std::max<uint32_t>(env.credits, 1))) {}

InlineTransport::~InlineTransport() = default;

size_t InlineTransport::idle_buffers() const { return pool_->idle(); }

absl::StatusOr<std::unique_ptr<Transport::Destination>> InlineTransport::ReserveChecked(
    uint64_t serial, uint64_t bytes) {
  absl::Status st = in_flight_->Reserve(bytes, absl::StrCat("a batch of ", bytes, " bytes"));
  if (!st.ok()) return st;
  auto d = std::make_unique<InlineDestination>();
  d->serial = serial;
  auto b = std::make_shared<InlineBuffer>();
  b->reservation = Reservation(in_flight_, bytes);
  std::unique_ptr<Mapping> m = pool_->Take(bytes);
  if (m == nullptr) {
    m = std::make_unique<Mapping>();
    // An eighth more than asked: batches vary in size (sequences, sparse streams), and a
    // mapping is reused by any batch that fits it.
    const uint64_t mapped = std::max<uint64_t>(bytes + bytes / 8, 1);
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a batch of ", bytes, " bytes"));
    m->data = static_cast<std::byte*>(p);
    m->size = mapped;
    m->locked = LockForAssembler(p, mapped);  // kept while the mapping is reused
  }
  d->bytes = absl::MakeSpan(m->data, bytes);
  b->pages = std::make_shared<InlinePages>(std::move(m), pool_);
  d->buffer = std::move(b);
  return d;
}

void InlineTransport::Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                               std::vector<OutgoingMessage>* out) {
  auto* d = static_cast<InlineDestination*>(destination.get());
  // Parts reference the one buffer (through `payload`, which shares its ownership); each
  // is sent from there (OutgoingMessage::Encode), its slice holding the pages.
  const std::shared_ptr<const std::byte> bytes(d->buffer, d->buffer->pages->mapping->data);
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
