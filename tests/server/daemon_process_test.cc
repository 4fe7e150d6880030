// conveyord as a process: kill -9 mid-epoch, restart, resume from the last batch consumed:
// every sequence of the epoch arrives, none twice. SIGTERM drains and exits 0. A daemon
// frozen by SIGSTOP is noticed within seconds (keepalive, idle deadline) and left for a replica.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include "client/cpp/conveyor_client.h"
#include "gtest/gtest.h"
#include "tests/server/daemon_process.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

v1::Subscribe Sub() {
  v1::Subscribe s;
  s.set_dataset("sparse");
  s.set_minibatch_size(100);
  s.set_randomize(true);
  s.set_seed(9);
  return s;
}

// `conveyor ARGS`: its exit status and its output (stdout, then stderr).
using CliRun = CommandRun;
CliRun Conveyor(const std::string& args) {
  // The one-line checks assume gRPC's own log is quiet, as the CLI makes it unless asked.
  ::unsetenv("GRPC_VERBOSITY");
  ::unsetenv("GRPC_TRACE");
  return RunCommand(std::string(CONVEYOR_BINARY) + " " + args);
}

// Reads `sub` (at most 100000 batches) until a Next() fails; that error.
absl::Status ReadUntilItFails(Subscription* sub, ReceivedBatch* b) {
  for (int i = 0; i < 100000; ++i) {
    auto more = sub->Next(b);
    if (!more.ok()) return more.status();
  }
  return absl::OkStatus();
}

TEST(DaemonProcess, KillNineRestartResumeDeliversEverySequenceOnce) {
  TempDir dir;
  std::multiset<uint64_t> keys;
  std::string cursor;
  {
    DaemonProcess d(dir.path());
    ASSERT_TRUE(d.started());
    auto client = Client::Connect(d.address());
    SubscribeOptions once;
    once.reconnect = false;
    auto sub = (*client)->Subscribe(Sub(), once);
    ReceivedBatch b;
    for (int i = 0; i < 7; ++i) {
      ASSERT_TRUE(*(*sub)->Next(&b));
      for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
    }
    d.Kill(SIGKILL);  // mid-epoch, with batches in flight
    // Batches already received before the kill are still consumed; then the stream breaks.
    while (true) {
      auto after = (*sub)->Next(&b);
      if (!after.ok()) break;
      ASSERT_TRUE(*after);
      for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
    }
    cursor = (*sub)->last_cursor();
    EXPECT_LT(keys.size(), 2000u);
  }
  DaemonProcess restarted(dir.path());
  ASSERT_TRUE(restarted.started());
  auto client = Client::Connect(restarted.address());
  v1::Subscribe s = Sub();
  s.set_resume_cursor(cursor);
  auto sub = (*client)->Subscribe(s);
  ReceivedBatch b;
  while (true) {
    auto more = (*sub)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    for (uint64_t k : b.descriptor().pieces().key()) keys.insert(k);
  }
  EXPECT_EQ(keys.size(), 2000u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 2000u);
}

// The data file rewritten in place while the daemon serves it (same size, new mtime): the
// stream ends with DATA_LOSS naming the file instead of serving the new bytes at the old
// index's offsets, and the daemon's log says so, for the operator.
TEST(DaemonProcess, ADataFileRewrittenInPlaceEndsItsStreamsAndIsLogged) {
  TempDir dir;
  std::string before, after;
  for (int i = 0; i < 40000; ++i) before += std::to_string(i) + " |x " + std::to_string(i % 97) + "\n";
  for (int i = 0; after.size() < before.size(); ++i) after += std::to_string(i) + " |x 7777777\n";
  after.resize(before.size() - 1);
  after += "\n";
  const std::string data = dir.Write("x.ctf", before);
  const std::string config = dir.Write("d.yaml", "datasets:\n  d:\n    randomize: false\n    deserializers:\n"
                                                 "      - type: CNTKTextFormat\n        chunkSizeInBytes: 4096\n"
                                                 "        file: " + data + "\n        input: {x: {dim: 1, format: dense}}\n");
  DaemonProcessOptions o;
  o.config = config;
  o.stderr_path = dir.path() + "/conveyord.log";
  DaemonProcess d(dir.path(), o);
  ASSERT_TRUE(d.started());
  auto client = Client::Connect(d.address());
  ASSERT_TRUE(client.ok()) << client.status();
  v1::Subscribe s;
  s.set_dataset("d");
  s.set_minibatch_size(10);
  s.set_initial_credits(1);
  SubscribeOptions once;
  once.reconnect = false;
  auto sub = (*client)->Subscribe(s, once);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ReceivedBatch b;
  ASSERT_TRUE(*(*sub)->Next(&b));
  ASSERT_EQ(RewriteInPlace(data, after), absl::OkStatus());
  absl::Status end;
  uint64_t batches = 1;
  while (true) {
    auto more = (*sub)->Next(&b);
    if (!more.ok()) {
      end = more.status();
      break;
    }
    ASSERT_TRUE(*more) << "the whole epoch was served from the rewritten file";
    // Only chunks parsed before the rewrite: a few of the 4 KiB chunks (about 30 batches
    // each) ahead of the consumer, not the epoch's 4000 batches.
    ASSERT_LT(++batches, 1000u);
  }
  EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss) << end;
  EXPECT_NE(end.message().find("x.ctf: the file was changed after it was opened"), std::string::npos) << end;
  std::string log;
  for (int i = 0; i < 100 && log.find("a stream ended") == std::string::npos; ++i) {
    log = ReadFile(o.stderr_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(log.find("conveyord: dataset 'd': a stream ended with DATA_LOSS: " + data +
                     ": the file was changed after it was opened"),
            std::string::npos)
      << log;
}

// Two replicas behind one client: the daemon serving the stream is killed mid-epoch, the
// subscription resumes from its cursor on the other, and the epoch arrives exactly once.
TEST(DaemonProcess, FailoverToAReplicaCompletesTheEpochExactlyOnce) {
  TempDir dir;
  auto a = std::make_unique<DaemonProcess>(dir.path());
  DaemonProcess b(dir.path());
  ASSERT_TRUE(a->started() && b.started());
  auto client = Client::Connect(a->address() + "," + b.address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto names = (*client)->ListDatasets();
  ASSERT_TRUE(names.ok()) << names.status();
  auto sub = (*client)->Subscribe(Sub());
  ASSERT_TRUE(sub.ok());
  std::multiset<uint64_t> keys;
  ReceivedBatch batch;
  uint64_t batches = 0;
  while (true) {
    auto more = (*sub)->Next(&batch);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    for (uint64_t k : batch.descriptor().pieces().key()) keys.insert(k);
    if (++batches == 5) {
      EXPECT_EQ((*sub)->address(), a->address());
      a.reset();  // kill -9 of the daemon in use, batches in flight
    }
  }
  EXPECT_EQ((*sub)->address(), b.address());
  EXPECT_EQ(keys.size(), 2000u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 2000u);
  // Unary calls skip the dead replica too.
  EXPECT_TRUE((*client)->Describe("sparse").ok());
}

// A subscription that takes every second batch from epoch 1 on (a DataLoader worker's share)
// fails over mid-stream: the resumed stream starts after the last batch handed out, so the
// client asks for the batch `stride` on from there and no longer for a first epoch (which the
// daemon refuses next to a cursor). The batches are exactly those of an uninterrupted run.
TEST(DaemonProcess, FailoverKeepsABatchStrideAndAFirstEpoch) {
  TempDir dir;
  v1::Subscribe s = Sub();
  s.set_epochs(3);
  s.set_first_epoch(1);
  s.set_batch_stride(2);
  s.set_batch_offset(1);
  auto read_all = [&](Client* client, DaemonProcess* kill_after_5) {
    std::vector<std::pair<uint64_t, uint64_t>> batches;  // (epoch, batch)
    std::vector<uint64_t> keys;
    auto sub = client->Subscribe(s);
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) return std::make_pair(batches, keys);
    ReceivedBatch b;
    while (true) {
      auto more = (*sub)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      batches.emplace_back(b.descriptor().epoch(), b.descriptor().batch());
      for (uint64_t k : b.descriptor().pieces().key()) keys.push_back(k);
      if (batches.size() == 5 && kill_after_5 != nullptr) kill_after_5->Kill(SIGKILL);
    }
    return std::make_pair(batches, keys);
  };
  DaemonProcess a(dir.path());
  DaemonProcess b(dir.path());
  ASSERT_TRUE(a.started() && b.started());
  auto alone = Client::Connect(b.address());
  ASSERT_TRUE(alone.ok());
  const auto expected = read_all(alone->get(), nullptr);
  ASSERT_EQ(expected.first.size(), 20u);  // 20 batches an epoch, epochs 1 and 2, odd ones
  EXPECT_EQ(expected.first.front(), std::make_pair(uint64_t{1}, uint64_t{1}));
  EXPECT_EQ(expected.first.back(), std::make_pair(uint64_t{2}, uint64_t{19}));
  auto both = Client::Connect(a.address() + "," + b.address());
  ASSERT_TRUE(both.ok());
  const auto failed_over = read_all(both->get(), &a);
  EXPECT_EQ(failed_over.first, expected.first);
  EXPECT_EQ(failed_over.second, expected.second);
}

// `conveyor health` (the container's HEALTHCHECK) against a live daemon, one that ignores
// SIGHUP, and a dead one.
TEST(DaemonProcess, HealthCommandTellsServingFromGone) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  auto health = [&] {
    const std::string cmd = std::string(CONVEYOR_BINARY) + " health --quiet --timeout 2 " + d.address();
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(health(), 0);
  d.Signal(SIGHUP);  // reload is not supported: the daemon says so and keeps serving
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(health(), 0);
  d.Kill(SIGKILL);
  EXPECT_EQ(health(), 1);
}

// `conveyor datasets`, as an ops engineer asks a daemon what it serves: through its unix
// socket by path (no token), over TCP with the token file (and without: told what to pass), a
// name it does not serve, and nothing listening any more.
TEST(DaemonProcess, DatasetsCommandDescribesWhatTheDaemonServes) {
  TempDir dir;
  const std::string token = dir.Write("token", "s3cret\n");
  DaemonProcessOptions o;
  o.unix_socket = true;
  o.extra = {"--token-file", token};
  DaemonProcess d(dir.path(), o);
  ASSERT_TRUE(d.started());
  using Run = CliRun;
  auto conveyor = [](const std::string& args) { return Conveyor("datasets " + args); };
  // examples/conveyor.yaml: simple is 1000 lines of two dense 2-dim streams, in one chunk (a
  // 32 MiB default chunk), window 4 GiB / 32 MiB = 128 chunks, randomize: false.
  const Run text = conveyor(d.socket_path());
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_EQ(text.out.substr(0, text.out.find('\n')), d.socket_path() + " serves 3 datasets");
  for (const char* line : {"\nsimple: CNTKTextFormat, float; 1000 sequences, 1000 samples a sweep, 1 chunk\n"
                           "  file order by default; sequence mode\n"
                           "  stream    alias     format         dim\n"
                           "  features  features  dense            2\n"
                           "  labels    labels    dense            2\n",
                           "\nsparse: CNTKTextFormat, float; 2000 sequences, 2000 samples a sweep, 1 chunk\n",
                           "  words   x      sparse        5000\n",
                           "  word    word   sparse        1000  (counts toward the minibatch size)\n"}) {
    EXPECT_NE(text.out.find(line), std::string::npos) << line << "\nnot in\n" << text.out;
  }
  const Run json = conveyor(d.address() + " sparse --json --token-file " + token);
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_EQ(json.out,
            "{\"name\": \"sparse\", \"deserializers\": [\"CNTKTextFormat\"], \"precision\": \"float\", \"chunks\": 1, "
            "\"sequences\": 2000, \"samples\": 2000, \"randomize\": false, \"randomization_window\": 128, "
            "\"randomization_window_unit\": \"chunks\", \"frame_mode\": false, \"streams\": [{\"name\": \"words\", "
            "\"alias\": \"x\", \"format\": \"sparse\", \"dim\": 5000, \"defines_minibatch_size\": false}, "
            "{\"name\": \"label\", \"alias\": \"y\", \"format\": \"dense\", \"dim\": 1, "
            "\"defines_minibatch_size\": false}]}\n");
  const Run no_token = conveyor(d.address());
  EXPECT_EQ(no_token.code, 1) << no_token.out;
  EXPECT_NE(no_token.out.find(d.address() + ": a valid 'authorization: Bearer <token>' is required; pass the "
                                            "daemon's token with --token-file"),
            std::string::npos)
      << no_token.out;
  const Run unknown = conveyor(d.unix_address() + " simple nope");
  EXPECT_EQ(unknown.code, 1) << unknown.out;
  EXPECT_NE(unknown.out.find("no dataset 'nope' (served: sequences, simple, sparse)"), std::string::npos) << unknown.out;
  // Replicas: the first not listening, the second the socket by its bare path.
  const Run replicas = conveyor("127.0.0.1:1," + d.socket_path() + " simple --json");
  EXPECT_EQ(replicas.code, 0) << replicas.out;
  EXPECT_EQ(replicas.out.rfind("{\"name\": \"simple\"", 0), 0u) << replicas.out;
  d.Kill(SIGKILL);
  const Run gone = conveyor(d.address() + " --token-file " + token);
  EXPECT_EQ(gone.code, 1) << gone.out;
  EXPECT_NE(gone.out.find("is conveyord running and listening there? ('conveyor health " + d.address()),
            std::string::npos)
      << gone.out;
}

// TLS set up wrong in each of the usual ways: one line that says which, no gRPC log lines.
TEST(DaemonProcess, DaemonCommandsSayWhatIsWrongWithTls) {
  TempDir dir;
  auto make_cert = [&](const std::string& name) {
    const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=conveyor-test -addext "
                            "subjectAltName=DNS:conveyor-test -keyout " + dir.path() + "/" + name + ".key -out " +
                            dir.path() + "/" + name + ".pem >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  };
  if (!make_cert("cert") || !make_cert("other")) GTEST_SKIP() << "openssl could not make a test certificate";
  const std::string cert = dir.path() + "/cert.pem", other = dir.path() + "/other.pem";
  const std::string token = dir.Write("token", "s3cret\n");
  DaemonProcessOptions o;
  o.extra = {"--token-file", token, "--tls-cert", cert, "--tls-key", dir.path() + "/cert.key"};
  DaemonProcess tls(dir.path(), o);
  ASSERT_TRUE(tls.started());
  DaemonProcess plain(dir.path());
  ASSERT_TRUE(plain.started());
  const std::string t = " --token-file " + token;
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {tls.address() + t, "the daemon closed the connection at once: one serving TLS is reached with --tls-ca"},
           {tls.address() + t + " --tls-ca " + cert, "its certificate is for another name: pass that name with --tls-server-name"},
           {tls.address() + t + " --tls-ca " + other + " --tls-server-name conveyor-test",
            "the daemon's certificate is not signed by the --tls-ca roots"},
           {plain.address() + " --tls-ca " + cert, "the daemon does not serve TLS there: connect without --tls-ca"},
       }) {
    const CliRun r = Conveyor("datasets " + args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
  }
  const CliRun good = Conveyor("datasets " + tls.address() + t + " --tls-ca " + cert + " --tls-server-name conveyor-test simple");
  EXPECT_EQ(good.code, 0) << good.out;
  const CliRun stream = Conveyor("subscribe " + tls.address() + t + " --tls-ca " + cert +
                                 " --tls-server-name conveyor-test --dataset simple --minibatch-size 500");
  EXPECT_EQ(stream.code, 0) << stream.out;
  EXPECT_NE(stream.out.find("simple from " + tls.address() + ": 2 batches, 1000 samples"), std::string::npos) << stream.out;
}

TEST(DaemonProcess, SigtermDrainsAndExitsCleanly) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  auto client = Client::Connect(d.address());
  SubscribeOptions once;
  once.reconnect = false;
  v1::Subscribe s = Sub();
  s.set_epochs(1000);
  auto sub = (*client)->Subscribe(s, once);
  ReceivedBatch b;
  ASSERT_TRUE(*(*sub)->Next(&b));
  std::thread stopper([&] { EXPECT_EQ(d.Kill(SIGTERM), 0); });
  const absl::Status end = ReadUntilItFails(sub->get(), &b);
  stopper.join();
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
}

// Out of file descriptors, the gRPC listener of Debian 12 (1.51) logs "Failed accept4: Too
// many open files" and never accepts again, even once descriptors are free (grpc#20418): a
// hostile peer holding connections, or too many trainers, would leave the daemon up but
// deaf. It drains and exits with status 1 instead (for systemd or Kubernetes to restart it),
// saying why; a subscription already running ends UNAVAILABLE with its cursor.
TEST(DaemonProcess, RunningOutOfFileDescriptorsDrainsAndExitsForARestart) {
  TempDir dir;
  DaemonProcessOptions o;
  o.max_open_files = 64;
  o.stderr_path = dir.path() + "/conveyord.log";
  DaemonProcess d(dir.path(), o);
  ASSERT_TRUE(d.started());
  auto client = Client::Connect(d.address());
  ASSERT_TRUE(client.ok()) << client.status();
  SubscribeOptions once;
  once.reconnect = false;
  v1::Subscribe s = Sub();
  s.set_epochs(1000);
  auto sub = (*client)->Subscribe(s, once);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ReceivedBatch b;
  ASSERT_TRUE(*(*sub)->Next(&b));
  // More connections than descriptors: the kernel completes them, gRPC accepts until EMFILE.
  // A connect refused part way is the daemon already closing its listener (it saw EMFILE
  // before the last of them; under load it can): what follows checks that it did so.
  const int port = std::stoi(d.address().substr(d.address().rfind(':') + 1));
  std::vector<int> sockets;
  for (int i = 0; i < 100; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int error = errno;
      ::close(fd);
      ASSERT_EQ(error, ECONNREFUSED) << std::strerror(error);
      ASSERT_GE(sockets.size(), 10u) << "refused before the daemon could have run out of its 64 descriptors";
      break;
    }
    sockets.push_back(fd);
  }
  const absl::Status end = ReadUntilItFails(sub->get(), &b);
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  const int status = d.WaitExit(20);
  for (int fd : sockets) ::close(fd);
  ASSERT_NE(status, -1) << "still running";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream log(o.stderr_path);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("conveyord: the process ran out of file descriptors (limit 64) and gRPC stopped accepting "
                      "connections for good; draining 1 stream(s) and exiting with status 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Too many open files"), std::string::npos) << text;
}

// libprotobuf prints a line for every request string that is not UTF-8; any client can send
// such requests, so the daemon lets at most 10 of them through a minute.
TEST(DaemonProcess, RequestsThatAreNotUtf8DoNotFloodItsLog) {
  TempDir dir;
  DaemonProcessOptions o;
  o.stderr_path = dir.path() + "/conveyord.log";
  DaemonProcess d(dir.path(), o);
  ASSERT_TRUE(d.started());
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  static const grpc::internal::RpcMethod kDescribe("/conveyor.v1.Loader/DescribeDataset",
                                                   grpc::internal::RpcMethod::NORMAL_RPC);
  const char body[] = {0x0a, 0x02, static_cast<char>(0xff), static_cast<char>(0xfe)};  // dataset: 2 bytes, not UTF-8
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(body, sizeof(body));
    grpc::ByteBuffer request(&slice, 1), response;
    const grpc::Status st = grpc::internal::BlockingUnaryCall(channel.get(), kDescribe, &ctx, request, &response);
    ASSERT_FALSE(st.ok());
  }
  EXPECT_EQ(d.Kill(SIGTERM), 0);
  std::ifstream log(o.stderr_path);
  std::string line;
  int protobuf_lines = 0;
  while (std::getline(log, line)) protobuf_lines += line.rfind("[libprotobuf", 0) == 0;
  EXPECT_GE(protobuf_lines, 1);
  EXPECT_LE(protobuf_lines, 10);
}

// A daemon frozen by SIGSTOP keeps its connections open (the kernel still acknowledges TCP),
// so only the client's own clocks notice: HTTP/2 keepalive (a ping every keepalive_time_ms
// unanswered for keepalive_timeout_ms more closes the connection) and the idle deadline (no
// message for idle_timeout). Each alone ends the stream UNAVAILABLE within seconds.
struct FrozenCase {
  const char* what;
  int keepalive_time_ms;  // INT32_MAX: no keepalive pings in this case
  std::chrono::milliseconds idle_timeout;
  const char* message;  // part of the error's message
};

class FrozenDaemon : public ::testing::TestWithParam<FrozenCase> {};

TEST_P(FrozenDaemon, TheClientLearnsWithinSecondsAndGetsUnavailable) {
  const FrozenCase& c = GetParam();
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  ClientOptions options;
  options.keepalive_time_ms = c.keepalive_time_ms;
  options.keepalive_timeout_ms = 1000;
  auto client = Client::Connect(d.address(), options);
  SubscribeOptions once;
  once.reconnect = false;
  once.idle_timeout = c.idle_timeout;
  v1::Subscribe s = Sub();
  s.set_epochs(100);
  auto sub = (*client)->Subscribe(s, once);
  ReceivedBatch b;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(*(*sub)->Next(&b));
  d.Signal(SIGSTOP);
  const auto frozen = std::chrono::steady_clock::now();
  absl::Status error;
  int after = 0;
  while (true) {  // what was sent before the freeze, then the error
    auto more = (*sub)->Next(&b);
    if (!more.ok()) {
      error = more.status();
      break;
    }
    ASSERT_TRUE(*more);
    ASSERT_LT(++after, 100) << "batches keep coming from a stopped daemon";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen).count();
  std::printf("%s: UNAVAILABLE %.1f s after SIGSTOP (%d batches in flight read first): %s\n", c.what, seconds,
              after, std::string(error.message()).c_str());
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << error;
  EXPECT_NE(error.message().find(c.message), std::string::npos) << error;
  EXPECT_LT(seconds, 6.0);
  EXPECT_GT(seconds, 0.5);  // it was the clock, not something else ending the stream at once
  d.Signal(SIGCONT);
}

INSTANTIATE_TEST_SUITE_P(
    Clocks, FrozenDaemon,
    ::testing::Values(FrozenCase{"keepalive", 1000, std::chrono::milliseconds(0), "keepalive"},
                      FrozenCase{"idle deadline", INT32_MAX, std::chrono::milliseconds(1500), "the idle deadline"}),
    [](const ::testing::TestParamInfo<FrozenCase>& param) {
      return std::string(param.param.keepalive_time_ms == INT32_MAX ? "IdleDeadline" : "Keepalive");
    });

// `conveyor subscribe --idle-timeout` against a daemon frozen before the stream starts: the
// command ends with the idle deadline's error instead of waiting.
TEST(DaemonProcess, SubscribeCommandGivesUpOnAFrozenDaemonAfterItsIdleTimeout) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_TRUE(d.started());
  d.Signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r = Conveyor("subscribe " + d.address() + " --dataset sparse --no-reconnect --idle-timeout 1.5 --keepalive 3600");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  d.Signal(SIGCONT);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("for 1500 ms (the idle deadline)"), std::string::npos) << r.out;
  EXPECT_LT(seconds, 6.0) << r.out;
}

// Two replicas: the one serving the stream is frozen mid-epoch; within seconds the
// subscription resumes from its cursor on the other, and the epoch arrives exactly once.
TEST(DaemonProcess, AFrozenDaemonIsLeftForAReplicaWithinSecondsAndTheEpochArrivesOnce) {
  TempDir dir;
  DaemonProcess a(dir.path());
  DaemonProcess b(dir.path());
  ASSERT_TRUE(a.started() && b.started());
  ClientOptions options;
  options.keepalive_time_ms = 1000;
  options.keepalive_timeout_ms = 1000;
  auto client = Client::Connect(a.address() + "," + b.address(), options);
  SubscribeOptions resume;
  resume.idle_timeout = std::chrono::milliseconds(5000);
  auto sub = (*client)->Subscribe(Sub(), resume);
  std::multiset<uint64_t> keys;
  ReceivedBatch batch;
  uint64_t batches = 0;
  double longest_wait = 0;
  auto last = std::chrono::steady_clock::now();
  while (true) {
    auto more = (*sub)->Next(&batch);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    const auto now = std::chrono::steady_clock::now();
    longest_wait = std::max(longest_wait, std::chrono::duration<double>(now - last).count());
    last = now;
    for (uint64_t k : batch.descriptor().pieces().key()) keys.insert(k);
    if (++batches == 5) {
      EXPECT_EQ((*sub)->address(), a.address());
      a.Signal(SIGSTOP);
    }
  }
  std::printf("longest wait for a batch across the freeze: %.1f s\n", longest_wait);
  EXPECT_EQ((*sub)->address(), b.address());
  EXPECT_LT(longest_wait, 6.0);
  EXPECT_EQ(keys.size(), 2000u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 2000u);
}

}  // namespace
}  // namespace conveyor::testing
