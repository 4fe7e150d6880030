// daemon_process.h: conveyord as a child process for the tests that need a real daemon
// (signals, kill -9, SIGSTOP, its memory and threads as the kernel sees them).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace conveyor::testing {

struct DaemonProcessOptions {
  std::string config;              // default: examples/conveyor.yaml
  bool unix_socket = false;        // listen on <dir>/d<N>.sock too (shared memory)
  std::string socket_path;         // with unix_socket: this path instead (a restart at the same place)
  std::string listen = "127.0.0.1:0";  // TCP; a fixed port for a restart at the same address
  std::vector<std::string> extra;  // more flags
  std::string stderr_path;         // its stderr goes to this file (default: the test's)
  uint64_t max_open_files = 0;     // RLIMIT_NOFILE, soft and hard (0: inherited)
};

class DaemonProcess {
 public:
  // Starts conveyord on 127.0.0.1 port 0 and waits (up to 10 s) until it listens; files go
  // into `dir`.
  explicit DaemonProcess(const std::string& dir, const DaemonProcessOptions& options = {});
  ~DaemonProcess();  // SIGKILL if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool started() const { return !port_.empty(); }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + port_; }
  std::string unix_address() const { return "unix:" + socket_; }
  const std::string& socket_path() const { return socket_; }
  void Signal(int sig);
  // Sends `sig` and waits for the process; returns its wait status (-1 if not running).
  int Kill(int sig);
  // Waits up to `seconds` for the process to exit by itself; its wait status, or -1 if it is
  // still running (or was not).
  int WaitExit(double seconds);
  // From /proc/PID: resident memory (VmRSS) in bytes and the number of threads.
  uint64_t RssBytes() const;
  int Threads() const;
  // The threads' names (/proc/PID/task/*/comm), each with its count.
  std::map<std::string, int> ThreadNames() const;
  // What /proc/PID/fd points at, one entry a descriptor (e.g. "socket:[123]", "/memfd:...").
  std::vector<std::string> OpenFiles() const;

 private:
  static inline int count_ = 0;
  pid_t pid_ = -1;
  std::string port_;
  std::string socket_;
};

}  // namespace conveyor::testing
