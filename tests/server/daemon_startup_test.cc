// conveyord's startup as a process: it never takes over a live daemon's addresses (a TCP
// port in use, a unix socket a daemon answers on) but replaces a stale socket, gives the
// socket its mode before anyone can connect, stops at once on SIGTERM while it is still
// loading, refuses non-loopback TCP without a token, and keeps reflection off where a token
// guards the other calls.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/conveyor_client.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

const std::string kExamples = std::string(CONVEYOR_SOURCE_DIR) + "/examples/conveyor.yaml";

// A conveyord process with `args`, its stderr in a file.
class Daemon {
 public:
  Daemon(const std::string& dir, std::vector<std::string> args) {
    static int count = 0;
    const std::string tag = std::to_string(++count);
    port_file_ = dir + "/port." + tag;
    err_file_ = dir + "/stderr." + tag;
    args.insert(args.end(), {"--port-file", port_file_});
    pid_ = ::fork();
    if (pid_ == 0) {
      const int err = ::open(err_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(err, 2);
      std::vector<char*> argv{const_cast<char*>("conveyord")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(CONVEYORD_BINARY, argv.data());
      ::_exit(127);
    }
  }
  ~Daemon() { Stop(SIGKILL); }

  // Waits until it serves (its port file appears) or exits; true when it serves.
  bool WaitServing() {
    for (int i = 0; i < 400; ++i) {
      std::ifstream in(port_file_);
      if (in >> port_) return true;
      if (Exited()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  // Waits for the process to end by itself (at most `limit`); its exit status, or -1.
  int WaitExit(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (Exited()) return code_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  int Stop(int sig) {
    if (pid_ > 0 && !Exited()) {
      ::kill(pid_, sig);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
    }
    return code_;
  }
  std::string address() const { return "127.0.0.1:" + port_; }
  std::string err() const { return ReadFile(err_file_); }

 private:
  bool Exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pid_ = -1;
    return true;
  }
  pid_t pid_ = -1;
  int code_ = -1;
  std::string port_file_, err_file_, port_;
};

TEST(DaemonStartup, RefusesATcpPortALiveDaemonHolds) {
  TempDir dir;
  Daemon first(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--no-unix"});
  ASSERT_TRUE(first.WaitServing()) << first.err();
  Daemon second(dir.path(), {kExamples, "--listen", first.address(), "--no-unix"});
  EXPECT_EQ(second.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_NE(second.err().find(first.address() + " is already in use"), std::string::npos) << second.err();
  // The first still serves every call.
  auto client = Client::Connect(first.address());
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListDatasets().ok());
}

TEST(DaemonStartup, RefusesALiveUnixSocketAndReplacesAStaleOne) {
  TempDir dir;
  const std::string sock = dir.path() + "/d.sock";
  Daemon first(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--unix", sock});
  ASSERT_TRUE(first.WaitServing()) << first.err();
  Daemon second(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--unix", sock});
  EXPECT_EQ(second.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_NE(second.err().find("unix:" + sock + " belongs to a running daemon"), std::string::npos) << second.err();
  auto client = Client::Connect("unix:" + sock);
  ASSERT_TRUE((*client)->ListDatasets().ok());  // still the first daemon's

  first.Stop(SIGKILL);  // no drain: the socket files stay behind
  struct stat st;
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  Daemon third(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--unix", sock});
  ASSERT_TRUE(third.WaitServing()) << third.err();
  // gRPC may reuse the subchannel that saw the old daemon die and wait out its backoff.
  auto again = Client::Connect("unix:" + sock);
  bool listed = false;
  for (int i = 0; i < 100 && !listed; ++i) {
    listed = (*again)->ListDatasets().ok();
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(listed) << third.err();
}

TEST(DaemonStartup, SocketModeIsConfigurableAndSetBeforeServing) {
  TempDir dir;
  const std::string sock = dir.path() + "/g.sock";
  Daemon d(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--unix", sock, "--unix-mode", "0660"});
  ASSERT_TRUE(d.WaitServing()) << d.err();
  struct stat st;
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(::stat((sock + ".fd").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const std::string sock2 = dir.path() + "/u.sock";
  Daemon dflt(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--unix", sock2});
  ASSERT_TRUE(dflt.WaitServing()) << dflt.err();
  ASSERT_EQ(::stat(sock2.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(DaemonStartup, SigtermWhileLoadingStopsAtOnce) {
  TempDir dir;
  // A Kaldi table read from a command that says nothing for 20 s: the load waits on it.
  // (A FIFO as the data file did this before; it is refused at once now.)
  const std::string config = dir.Write(
      "pipe.yaml", "datasets:\n  f:\n    type: KaldiTable\n    rspecifier: \"ark:sleep 20 |\"\n    allowPipes: true\n"
                   "    input: {x: {}}\n");
  Daemon d(dir.path(), {config, "--listen", "127.0.0.1:0", "--no-unix"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  d.Stop(SIGTERM);
  EXPECT_EQ(d.WaitExit(std::chrono::seconds(5)), 0);
  EXPECT_NE(d.err().find("SIGTERM while starting"), std::string::npos) << d.err();
}

TEST(DaemonStartup, NonLoopbackTcpNeedsATokenOrInsecure) {
  TempDir dir;
  Daemon refused(dir.path(), {kExamples, "--listen", "0.0.0.0:0", "--no-unix"});
  EXPECT_EQ(refused.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_NE(refused.err().find("refusing to serve 0.0.0.0:0 without a token"), std::string::npos) << refused.err();
  const std::string token = dir.Write("token", "s3cret\n");
  Daemon with_token(dir.path(), {kExamples, "--listen", "0.0.0.0:0", "--no-unix", "--token-file", token});
  EXPECT_TRUE(with_token.WaitServing()) << with_token.err();
  const std::string config = dir.Write("insecure.yaml", "insecure: true\ndatasets:\n  s:\n    file: " +
                                                            std::string(CONVEYOR_SOURCE_DIR) +
                                                            "/examples/simple.ctf\n    input: {f: {dim: 2, format: dense}}\n");
  Daemon insecure(dir.path(), {config, "--listen", "0.0.0.0:0", "--no-unix"});
  EXPECT_TRUE(insecure.WaitServing()) << insecure.err();
}

// Calls the reflection service's list_services as a one-message stream; its status.
grpc::Status ListServicesByReflection(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const char request[] = {0x3a, 0x00};  // ServerReflectionRequest{list_services: ""}
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer in(&slice, 1), out;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  stub.UnaryCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", grpc::StubOptions(), &in,
                 &out, [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   result = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return result;
}

TEST(DaemonStartup, ReflectionAnswersOnlyWithoutAToken) {
  TempDir dir;
  Daemon open(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--no-unix"});
  ASSERT_TRUE(open.WaitServing()) << open.err();
  EXPECT_TRUE(ListServicesByReflection(open.address()).ok());
  const std::string token = dir.Write("token", "s3cret\n");
  Daemon guarded(dir.path(), {kExamples, "--listen", "127.0.0.1:0", "--no-unix", "--token-file", token});
  ASSERT_TRUE(guarded.WaitServing()) << guarded.err();
  EXPECT_EQ(ListServicesByReflection(guarded.address()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(DaemonStartup, VersionIsTheProjectsVersion) {
  TempDir dir;
  const std::string out = dir.path() + "/version";
  const std::string cmd = std::string(CONVEYORD_BINARY) + " --version > " + out + " && " + CONVEYOR_BINARY +
                          " --version >> " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string version = ReadFile(std::string(CONVEYOR_SOURCE_DIR) + "/VERSION");
  version = version.substr(0, version.find('\n'));
  const std::string text = ReadFile(out);
  EXPECT_EQ(text.find("conveyord " + version + " ("), 0u) << text;
  EXPECT_NE(text.find("\nconveyor " + version + " ("), std::string::npos) << text;
}

// The environment variables the daemon reads are where an operator looks first.
TEST(DaemonStartup, HelpNamesTheEnvironmentItReads) {
  TempDir dir;
  const std::string out = dir.path() + "/help";
  ASSERT_EQ(std::system((std::string(CONVEYORD_BINARY) + " --help > " + out).c_str()), 0);
  const std::string text = ReadFile(out);
  for (const char* name : {"CONVEYOR_HUGE_PAGES=0", "CONVEYOR_HUGE_BLOCK_CACHE_MB=N", "CONVEYOR_EXAMPLES=DIR"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from:\n" << text;
  }
}

}  // namespace
}  // namespace conveyor::testing
