// stream_reader.h: a client's reading of one Stream call, with the daemon treated as
// untrusted. Messages go in one at a time; out come segment announcements and whole batches
// (a batch's inline parts reassembled), each checked before it is handed on: sizes within
// the client's limits, serials counting 0, 1, 2, ... without duplicates or gaps, parts in
// order with the batch's serial and offsets, no message that is empty, stray, out of place
// or after the end, descriptors whose every array, shape and piece fits (DescriptorToPlan),
// and host bytes a reader can index safely (ValidateBatchBytes). Any violation is an error
// that ends the stream (the caller must cancel the call, not wait for the daemon to end it).
// Both C++ callers (the client library and tests/fuzz/stream_reader_fuzzer.cc) use it; the
// Python client implements the same checks (client/python/conveyor/stream_reader.py), and
// both run the same corpus of malformed streams (tests/fuzz/corpus/stream_reader_fuzzer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/batch/batch_plan.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor {

// What a client accepts from a daemon.
struct ClientLimits {
  uint64_t max_batch_bytes = kMaxBatchBytes;     // total_bytes of one batch
  uint64_t max_segment_bytes = uint64_t{1} << 40;  // a shared-memory or device segment
  size_t max_cursor_bytes = 4096;                // what the daemon accepts back to resume
};

// An inline part's bytes kept outside its message (proto/inline_wire.h: in the slices
// they arrived in), appended to the batch once they are checked.
class PartBytes {
 public:
  virtual ~PartBytes() = default;
  virtual uint64_t size() const = 0;
  virtual void AppendTo(std::string* out) const = 0;
};

class StreamReader {
 public:
  explicit StreamReader(const ClientLimits& limits = {}) : limits_(limits) {}

  enum class Event {
    kNeedMore,     // a part of a batch: feed the next message
    kSegment,      // segment() is a new shared-memory segment to map
    kCudaSegment,  // cuda_segment() is a new device block to open
    kBatch,        // batch() is complete and checked
    kEnd,          // the end of the stream: end() says where; nothing may follow
  };
  // Takes the next message. Errors: InvalidArgument (a protocol violation, named),
  // ResourceExhausted (a size past the client's limits). After an error the reader is
  // broken: every later call returns it again.
  absl::StatusOr<Event> Feed(v1::StreamResponse message);
  // The same, with the bytes of the message's inline part (a batch or a `more` part) in
  // `part` rather than in its payload's data (which must be empty).
  absl::StatusOr<Event> Feed(v1::StreamResponse message, const PartBytes* part);
  // The call ended with OK: an error unless the end-of-stream message came and no batch is
  // half received (a silent end must never look like the end of the data).
  absl::Status Finished() const;

  struct ReceivedBatch {
    v1::BatchDescriptor descriptor;  // payload data moved into `bytes`
    BatchPlan plan;
    std::string bytes;  // inline transport: the whole batch; else empty
  };
  // After kBatch: the batch, moved out (valid until the next Feed()).
  ReceivedBatch& batch() { return batch_; }
  // After kSegment / kCudaSegment / kEnd.
  const v1::SharedMemorySegment& segment() const { return segment_; }
  const v1::CudaIpcSegment& cuda_segment() const { return cuda_segment_; }
  const v1::EndOfStream& end() const { return end_; }
  // The size a segment was announced with, or 0 for an unknown id.
  uint64_t segment_bytes(uint32_t id) const;
  uint64_t cuda_segment_bytes(uint32_t id) const;
  uint64_t batches() const { return next_serial_; }

 private:
  absl::StatusOr<Event> Take(v1::StreamResponse message, const PartBytes* part);
  absl::StatusOr<Event> BeginBatch(v1::BatchDescriptor* d, const PartBytes* part);
  absl::StatusOr<Event> AddPart(const v1::MoreBytes& more, const PartBytes* part);
  absl::StatusOr<Event> Complete();

  ClientLimits limits_;
  absl::Status broken_;
  bool ended_ = false;
  uint64_t next_serial_ = 0;
  // A batch whose inline parts are arriving.
  bool assembling_ = false;
  uint32_t parts_left_ = 0;
  ReceivedBatch batch_;
  v1::SharedMemorySegment segment_;
  v1::CudaIpcSegment cuda_segment_;
  v1::EndOfStream end_;
  std::map<uint32_t, uint64_t> segments_, cuda_segments_;  // id -> bytes
};

}  // namespace conveyor
