// transport.h: the seam between a subscription's stream and how its batches travel. A
// Transport decides where a batch is assembled (an inline buffer, a shared-memory slot, a
// device slot), what is announced before it (new segments), how its messages describe it
// (payload parts, or a segment and offset), and when its memory is given back (written, or
// acknowledged, or the stream ends). The stream reactor knows only this interface; each
// kind lives in a file of its own and is made by MakeTransport() from the Subscribe's
// `transport` (one line per kind in registry.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batch/assembler.h"
#include "conveyor/v1/conveyor.pb.h"
#include "server/memory_budget.h"
#include "server/service_options.h"

namespace conveyor {
namespace gpu {
class HostRegistration;
}

// A message to write. An inline part carries its bytes by reference: `payload` keeps the
// batch's buffer (and its share of the daemon's budget) alive until the part is written,
// and Encode() sends the bytes from there, never copying them, so a batch is held once.
struct OutgoingMessage {
  v1::StreamResponse message;
  std::shared_ptr<const std::byte> payload;  // null: `message` is complete as it is
  uint64_t offset = 0, size = 0;
  // What keeps the payload's memory itself valid, for as long as gRPC holds the slice that
  // sends it (which may be a little past the write's completion, and past the stream):
  // nothing else, in particular no budget the daemon may have destroyed by then. Null: the
  // slice holds `payload`.
  std::shared_ptr<const void> memory;
  // The last message of a batch (set by the reactor): once it is written, the batch is sent.
  bool ends_batch = false;
  // The message as it goes on the wire: exactly the bytes of `message` with the referenced
  // part as its payload's data (a batch's or a `more` part's), as protobuf serializes them,
  // with the part itself a gRPC slice over the batch's buffer (no copy). Consumes
  // `message`.
  grpc::ByteBuffer Encode();
  // Copies the referenced part into the payload of `message` (tests: the message Encode()
  // writes the bytes of).
  void Materialize();
};

// What a subscription's transport is made from.
struct TransportEnv {
  const ServiceOptions* options = nullptr;  // must outlive the transport
  MemoryBudget* in_flight = nullptr;        // the daemon's budget for batches in flight; not owned
  uint32_t credits = 1;                     // the subscription's batches in flight at most
};

class Transport {
 public:
  // Where one batch goes, from Reserve() until Describe(): its bytes and the messages to
  // send before it. Each transport keeps what else it needs in a subclass of its own.
  struct Destination {
    virtual ~Destination() = default;
    uint64_t serial = 0;
    absl::Span<std::byte> bytes;                    // host or device memory, the batch's size
    std::vector<v1::StreamResponse> announcements;  // new segments, sent before the batch
  };

  // Frees every slot, segment and buffer it still holds (the stream is over; a buffer that
  // messages still reference lives until they are written or dropped).
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The label of the daemon's metrics: "inline", "shm", "cuda_ipc".
  virtual const char* name() const = 0;

  // The assembler for this transport's memory. The default assembles into host memory: the
  // CPU one, or the CUDA one with --assembler cuda (falling back to the CPU, logged once),
  // pipelined on a worker thread if the options say so. With the CUDA one, the host memory
  // this transport makes for batches from then on is page-locked (LockForAssembler), so that
  // the device copies each batch into it asynchronously while it assembles the next. Called
  // once, before the first Reserve(). Errors: those of making it.
  virtual absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeAssembler();

  // A destination for batch `serial` of `bytes`. First checks that `credits` batches of
  // this size fit the subscription's budget, whether or not the subscriber holds them now
  // (the outcome depends on the request and the data, not on timing). Errors:
  // ResourceExhausted (the subscription's or the daemon's budget, memfd or device memory),
  // Internal (sealing, tokens, IPC export). Called by one thread (the producer) at a time.
  absl::StatusOr<std::unique_ptr<Destination>> Reserve(uint64_t serial, uint64_t bytes);

  // Appends the messages of the batch at `destination` to `out`: its announcements, then
  // `first` (the batch's descriptor, complete but for where its bytes are) with this
  // transport's part, then any further parts. Producer thread only.
  virtual void Describe(std::unique_ptr<Destination> destination, v1::StreamResponse first,
                        std::vector<OutgoingMessage>* out) = 0;

  // Batch `serial` is acknowledged: its memory may take another batch. Thread-safe; never
  // blocks longer than a map update. Unknown serials are ignored.
  virtual void Release(uint64_t serial) = 0;

 protected:
  explicit Transport(const TransportEnv& env)
      : options_(*env.options), in_flight_(env.in_flight), credits_(env.credits) {}
  // Page-locks host memory this transport made for batches, for the device of the CUDA
  // assembler that MakeAssembler() made: the registration must be destroyed before the
  // memory is unmapped. Null when the assembler is not the CUDA one, or when locking fails
  // (logged once per transport; the assembler then copies back through pinned memory of its
  // own, one host pass more, and the batches are the same). Producer thread only.
  std::unique_ptr<gpu::HostRegistration> LockForAssembler(void* data, uint64_t bytes);
  // Reserve() past the subscription's budget check.
  virtual absl::StatusOr<std::unique_ptr<Destination>> ReserveChecked(uint64_t serial,
                                                                      uint64_t bytes) = 0;

  const ServiceOptions& options_;
  MemoryBudget* const in_flight_;
  const uint32_t credits_;

 private:
  int lock_for_device_ = -1;  // the CUDA assembler's device; -1: no page-locking
  bool lock_failure_logged_ = false;
};

// The transport a Subscribe asks for, checked against what the daemon offers. Errors:
// InvalidArgument (an unknown transport; shared memory without the daemon's unix socket; a
// cuda_device the daemon does not have), FailedPrecondition (CUDA IPC without a device).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const v1::Subscribe& subscribe,
                                                         const TransportEnv& env);

}  // namespace conveyor
