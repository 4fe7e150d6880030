#include "server/shared_memory.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor {

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1
#endif

absl::StatusOr<std::shared_ptr<ShmSegment>> ShmSegment::Create(uint64_t bytes) {
  const int fd = ::memfd_create("conveyor-slots", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  auto fail = [&](absl::StatusCode code, const std::string& what, void* mapped) {
    const int err = errno;
    if (mapped != nullptr) ::munmap(mapped, bytes);
    ::close(fd);
    return absl::Status(code, absl::StrCat(what, ": ", std::strerror(err)));
  };
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail(absl::StatusCode::kResourceExhausted, absl::StrCat("cannot size a ", bytes, "-byte segment"), nullptr);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::StatusCode::kResourceExhausted, absl::StrCat("cannot map a ", bytes, "-byte segment"), nullptr);
  }
  // The size can no longer change (a client's ftruncate would make the daemon's mapping
  // SIGBUS), and no one can write it but through the mapping made above.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return fail(absl::StatusCode::kInternal, "cannot seal a shared-memory segment", p);
  }
  // F_SEAL_FUTURE_WRITE needs Linux 5.1; older kernels keep the read-only descriptor alone.
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
    return fail(absl::StatusCode::kInternal, "cannot seal a shared-memory segment", p);
  }
  // A descriptor of its own for clients, opened read-only (a dup would share the daemon's
  // read-write open file).
  const int ro = ::open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) return fail(absl::StatusCode::kInternal, "cannot reopen a shared-memory segment read-only", p);
  return std::shared_ptr<ShmSegment>(new ShmSegment(fd, ro, static_cast<std::byte*>(p), bytes));
}

ShmSegment::~ShmSegment() {
  ::munmap(data_, size_);
  ::close(read_only_fd_);
  ::close(fd_);
}

int ShmSegment::seals() const { return ::fcntl(fd_, F_GET_SEALS); }

absl::StatusOr<std::string> RandomToken() {
  std::string token(16, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  return token;
}

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, unsigned mode) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError(absl::StrCat(path, ": socket path too long"));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const mode_t old = ::umask(0777 & ~static_cast<mode_t>(mode));  // from the start: no window for others
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old);
  if (rc != 0 || ::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot listen: ", std::strerror(err)));
  }
  return std::unique_ptr<FdServer>(new FdServer(path, fd));
}

FdServer::FdServer(std::string path, int listen_fd) : path_(std::move(path)), listen_fd_(listen_fd) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { Serve(); });
}

FdServer::~FdServer() {
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  thread_.join();
  ::close(listen_fd_);
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
  ::unlink(path_.c_str());
}

absl::StatusOr<std::string> FdServer::Register(std::shared_ptr<ShmSegment> segment) {
  auto token = RandomToken();
  if (!token.ok()) return token.status();
  std::lock_guard<std::mutex> lock(mu_);
  segments_[*token] = segment;
  return token;
}

void FdServer::Forget(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  segments_.erase(token);
}

void SendDescriptor(int c, int fd) {
  char byte = 'S';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  (void)!::sendmsg(c, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Connections are served side by side, each with one second in all to send its 16-byte
// token (not per read: a peer dripping a byte a second held the one connection served before,
// and every client's segment request waited behind it), and at most kMaxPending at once (the
// oldest gives way to a new one). A wrong token gets the connection closed.
void FdServer::Serve() {
  using Clock = std::chrono::steady_clock;
  constexpr size_t kMaxPending = 64;
  constexpr auto kTokenDeadline = std::chrono::seconds(1);
  struct Pending {
    int fd;
    std::string token;
    Clock::time_point deadline;
    bool failed = false;
  };
  std::deque<Pending> pending;  // oldest first
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    const bool wakeable = wake_[0] >= 0;
    if (wakeable) fds.push_back({wake_[0], POLLIN, 0});
    const size_t first = fds.size();
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    int timeout_ms = -1;
    if (!pending.empty()) {
      const auto left = pending.front().deadline - Clock::now();  // the oldest ends first
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (wakeable && fds[1].revents) break;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (fds[first + k].revents == 0) continue;
      Pending& p = pending[k];
      char buf[16];
      const ssize_t n = ::recv(p.fd, buf, 16 - p.token.size(), MSG_DONTWAIT);
      if (n > 0) {
        p.token.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        p.failed = true;  // closed, or broken, before its token
      }
    }
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->token.size() == 16) {
        std::shared_ptr<ShmSegment> seg;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto found = segments_.find(it->token);
          if (found != segments_.end()) seg = found->second.lock();
        }
        if (seg) SendDescriptor(it->fd, seg->read_only_fd());
      } else if (!it->failed && now < it->deadline) {
        ++it;
        continue;
      }
      ::close(it->fd);
      it = pending.erase(it);
    }
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
        // Out of descriptors: the connection stays queued and the socket readable; wait a
        // little rather than spin on it.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (c >= 0) {
        if (pending.size() >= kMaxPending) {
          ::close(pending.front().fd);
          pending.pop_front();
        }
        pending.push_back(Pending{c, std::string(), Clock::now() + kTokenDeadline});
      }
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
}

}  // namespace conveyor
