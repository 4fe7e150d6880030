// shared_segment.h: the client side of the shared-memory transport: fetch a segment's
// descriptor from the daemon's descriptor socket (SCM_RIGHTS, in exchange for the 16-byte
// token the stream announced) and map it read-only, treating the daemon as untrusted: the
// descriptor must be a regular file (a memfd) at least as large as announced and sealed
// against shrinking (F_SEAL_SHRINK), so that no one can truncate it under the mapping and
// turn a read into SIGBUS. Extra descriptors a daemon sends are closed.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor {

struct MappedSegment {
  MappedSegment() = default;
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;
  ~MappedSegment();
  const char* data = nullptr;
  uint64_t size = 0;
};

// Errors: Unavailable (the descriptor socket cannot be reached or sends no descriptor, within
// 10 s), InvalidArgument (a segment smaller than announced, not a regular file, not sealed
// against shrinking), ResourceExhausted (mmap).
absl::StatusOr<std::shared_ptr<MappedSegment>> MapSharedSegment(const v1::SharedMemorySegment& s);

}  // namespace conveyor
