// shared_memory.h: the shared-memory transport's daemon side. A ShmSegment is a memfd
// (no name in /dev/shm, so nothing is left behind when either side dies) mapped read-write
// by the daemon; an FdServer hands its descriptor to same-host clients over a unix socket
// (SCM_RIGHTS) in exchange for a 16-byte token the Stream call announced.
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
  // Errors: ResourceExhausted when memfd_create/ftruncate/mmap fail.
  static absl::StatusOr<std::shared_ptr<ShmSegment>> Create(uint64_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  int fd() const { return fd_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  ShmSegment(int fd, std::byte* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  const int fd_;
  std::byte* const data_;
  const uint64_t size_;
};

class FdServer {
 public:
  // Listens on `path` with permissions `mode` (0600: this user; 0660: and its group) from
  // the moment it exists; a stale socket there is replaced. Errors: the bind failure.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, unsigned mode = 0600);
  ~FdServer();
  const std::string& path() const { return path_; }
  // Makes `segment` fetchable with the returned 16-byte token until Forget(token).
  std::string Register(std::shared_ptr<ShmSegment> segment);
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
