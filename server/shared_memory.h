// shared_memory.h: the shared-memory transport's daemon side. A ShmSegment is a memfd
// (no name in /dev/shm, so nothing is left behind when either side dies) mapped read-write
// by the daemon and sealed so that no client can hurt it: its size is fixed (F_SEAL_SHRINK,
// F_SEAL_GROW: no ftruncate can make the daemon's mapping SIGBUS), nothing but the daemon's
// own mapping can write it (F_SEAL_FUTURE_WRITE, where the kernel has it), and the seals
// themselves are sealed (F_SEAL_SEAL). Clients get a read-only descriptor of it. An FdServer
// hands that descriptor to same-host clients over a unix socket (SCM_RIGHTS) in exchange for
// a 16-byte token (from getrandom) that the Stream call announced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace conveyor {

class ShmSegment {
 public:
  // Errors: ResourceExhausted when memfd_create/ftruncate/mmap fail; Internal when the
  // segment cannot be sealed or reopened read-only.
  static absl::StatusOr<std::shared_ptr<ShmSegment>> Create(uint64_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // The descriptor handed to clients: opened O_RDONLY, so neither a writable mapping nor an
  // mprotect to writable nor an ftruncate works through it.
  int read_only_fd() const { return read_only_fd_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The seals the segment carries (F_GET_SEALS), for tests.
  int seals() const;

 private:
  ShmSegment(int fd, int read_only_fd, std::byte* data, uint64_t size)
      : fd_(fd), read_only_fd_(read_only_fd), data_(data), size_(size) {}
  const int fd_;
  const int read_only_fd_;
  std::byte* const data_;
  const uint64_t size_;
};

// 16 bytes from the kernel's CSPRNG (getrandom). Errors: Internal if it fails.
absl::StatusOr<std::string> RandomToken();

// Sends `fd` over the connected unix socket `c`: one byte of data, the descriptor beside it
// (SCM_RIGHTS), without waiting (a peer that does not read gets nothing). What FdServer
// answers a good token with.
void SendDescriptor(int c, int fd);

class FdServer {
 public:
  // Listens on `path` with permissions `mode` (0600: this user; 0660: and its group) from
  // the moment it exists; a stale socket there is replaced. Errors: the bind failure.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, unsigned mode = 0600);
  ~FdServer();
  const std::string& path() const { return path_; }
  // Makes `segment` fetchable with the returned 16-byte token until Forget(token).
  // Errors: Internal when no random token can be had.
  absl::StatusOr<std::string> Register(std::shared_ptr<ShmSegment> segment);
  void Forget(const std::string& token);

 private:
  FdServer(std::string path, int listen_fd);
  void Serve();
  const std::string path_;
  const int listen_fd_;
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<ShmSegment>> segments_;
  std::thread thread_;
};

}  // namespace conveyor
