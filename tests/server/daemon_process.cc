#include "tests/server/daemon_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace conveyor::testing {
namespace {

std::string StatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 1);
  }
  return "";
}

}  // namespace

DaemonProcess::DaemonProcess(const std::string& dir, const DaemonProcessOptions& options) {
  const int n = ++count_;
  const std::string port_file = dir + "/port." + std::to_string(n);
  const std::string config =
      options.config.empty() ? std::string(CONVEYOR_SOURCE_DIR) + "/examples/conveyor.yaml" : options.config;
  std::vector<std::string> args = {"conveyord", config, "--listen", options.listen, "--port-file", port_file};
  if (options.unix_socket) {
    socket_ = options.socket_path.empty() ? dir + "/d" + std::to_string(n) + ".sock" : options.socket_path;
    args.push_back("--unix");
    args.push_back(socket_);
  } else {
    args.push_back("--no-unix");
  }
  args.insert(args.end(), options.extra.begin(), options.extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    if (!options.stderr_path.empty()) {
      const int fd = ::open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
    }
    if (options.max_open_files > 0) {
      const struct rlimit limit = {options.max_open_files, options.max_open_files};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    ::execv(CONVEYORD_BINARY, argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 400 && port_.empty(); ++i) {
    std::ifstream in(port_file);
    std::string p;
    if (in >> p) port_ = p;
    else std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);  // a stopped process is killed too
  Kill(SIGKILL);
}

void DaemonProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int DaemonProcess::Kill(int sig) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

int DaemonProcess::WaitExit(double seconds) {
  if (pid_ <= 0) return -1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    if (std::chrono::steady_clock::now() > until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

uint64_t DaemonProcess::RssBytes() const {
  std::istringstream in(StatusField(pid_, "VmRSS"));
  uint64_t kb = 0;
  in >> kb;
  return kb * 1024;
}

int DaemonProcess::Threads() const {
  std::istringstream in(StatusField(pid_, "Threads"));
  int n = 0;
  in >> n;
  return n;
}

std::map<std::string, int> DaemonProcess::ThreadNames() const {
  std::map<std::string, int> out;
  const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + e->d_name + "/comm");
    std::string name;
    if (std::getline(in, name)) ++out[name];
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> DaemonProcess::OpenFiles() const {
  std::vector<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid_) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[512];
    const ssize_t len = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (len > 0) out.emplace_back(target, static_cast<size_t>(len));
  }
  ::closedir(d);
  return out;
}

}  // namespace conveyor::testing
