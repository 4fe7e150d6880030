#include "server/listen_checks.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

// Splits "host:port" or "[v6]:port"; false when there is no port.
bool SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 >= listen.size()) return false;
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return true;
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& listen) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("listen address '", listen, "' needs a port (host:port)"));
  }
  // getaddrinfo() takes "70000" and wraps it to 4464: a port is checked first.
  const size_t digits = port.find_first_not_of('0');  // leading zeros are not a port's size
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      (digits != std::string::npos && (port.size() - digits > 5 || std::stoul(port.substr(digits)) > 65535))) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "': '", port.substr(0, 32), "' is not a TCP port (0 to 65535)"));
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("listen address '", listen, "': ", ::gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(result);
}

bool IsLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

bool IsLoopbackListenAddress(const std::string& listen) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port) || host.empty()) return false;  // ":7070" is every address
  auto ai = Resolve(listen);
  if (!ai.ok()) return false;
  for (const addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    if (!IsLoopback(a->ai_addr)) return false;
  }
  return true;
}

absl::Status CheckTcpAddressFree(const std::string& listen) {
  auto ai = Resolve(listen);
  if (!ai.ok()) return ai.status();
  for (const addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;  // e.g. no IPv6 on this host: gRPC skips it too
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC binds
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    ::close(fd);
    if (rc != 0 && err == EADDRINUSE) {
      return absl::FailedPreconditionError(absl::StrCat(
          listen, " is already in use (another conveyord? `ss -ltnp` shows who listens there); stop it or choose "
                  "another --listen"));
    }
    if (rc != 0 && err != EADDRNOTAVAIL && err != EAFNOSUPPORT) {
      return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", listen, ": ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

absl::Status PrepareUnixSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' must be 1 to ",
                                                   sizeof(addr.sun_path) - 1, " bytes long"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("unix:", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("unix:", path, " exists and is not a socket; conveyord leaves it alone: remove it or choose "
                                    "another --unix"));
  }
  // A socket file: live if a process accepts on it, stale (left by a daemon killed without
  // draining) if not.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0 || err == EAGAIN) {  // EAGAIN: a live listener with a full backlog
    return absl::FailedPreconditionError(absl::StrCat(
        "unix:", path, " belongs to a running daemon (it accepts connections); stop it or choose another --unix"));
  }
  if (err == EACCES || err == EPERM) {
    return absl::FailedPreconditionError(absl::StrCat("unix:", path, ": ", std::strerror(err),
                                                      " (another user's daemon?); choose another --unix"));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat("unix:", path, ": cannot remove the stale socket: ",
                                                      std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
