#include "client/cpp/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor {

MappedSegment::~MappedSegment() {
  if (data != nullptr) ::munmap(const_cast<char*>(data), size);
}

namespace {

// Receives one descriptor; closes any others that came with it. -1 if none.
int ReceiveDescriptor(int sock) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return -1;
  int fd = -1;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0)) continue;
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (fd < 0) {
        fd = got;
      } else {
        ::close(got);
      }
    }
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedSegment>> MapSharedSegment(const v1::SharedMemorySegment& s) {
  sockaddr_un addr{};
  if (s.fd_socket().empty() || s.fd_socket().size() >= sizeof(addr.sun_path) || s.token().size() != 16 ||
      s.bytes() == 0) {
    return absl::InvalidArgumentError("a shared-memory segment announcement is malformed");
  }
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv{10, 0};  // a daemon that does not answer must not hang the client
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, s.fd_socket().data(), s.fd_socket().size());
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::send(sock, s.token().data(), 16, MSG_NOSIGNAL) != 16) {
    ::close(sock);
    return absl::UnavailableError(absl::StrCat("cannot reach the daemon's descriptor socket ", s.fd_socket(),
                                               " (shared memory needs the same host)"));
  }
  const int fd = ReceiveDescriptor(sock);
  ::close(sock);
  if (fd < 0) return absl::UnavailableError("the daemon sent no segment descriptor");
  struct stat st;
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  absl::Status bad;
  if (!regular) {
    bad = absl::InvalidArgumentError("the shared-memory segment is not a memory file");
  } else if (static_cast<uint64_t>(st.st_size) < s.bytes()) {
    bad = absl::InvalidArgumentError(absl::StrCat("the shared-memory segment has ", st.st_size, " bytes, ", s.bytes(),
                                                  " were announced"));
  } else if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    bad = absl::InvalidArgumentError(
        "the shared-memory segment is not sealed against shrinking (F_SEAL_SHRINK): a truncation could crash the client");
  }
  if (!bad.ok()) {
    ::close(fd);
    return bad;
  }
  void* p = ::mmap(nullptr, s.bytes(), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the segment
  if (p == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("cannot map a shared-memory segment: ", std::strerror(errno)));
  auto m = std::make_shared<MappedSegment>();
  m->data = static_cast<const char*>(p);
  m->size = s.bytes();
  return m;
}

}  // namespace conveyor
