// The C++ client against a fake daemon that replays the streams of
// tests/fuzz/corpus/stream_reader_fuzzer (recorded from conveyord, and malformed variants of
// them): every well-formed stream is read to its end, every malformed one is an error within
// seconds (the client cancels the call; the fake daemon would otherwise hold it open for 10
// s), never a hang and never a silent end. Shared-memory segments that are not sealed against
// shrinking, or smaller than announced, are refused: a daemon that truncates one cannot
// crash the client with SIGBUS. tests/python/test_hostile_server.py runs the same corpus
// against the Python client.
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/conveyor_client.h"
#include "gtest/gtest.h"
#include "server/server_builder.h"
#include "server/shared_memory.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

const std::string kCorpus =
    std::string(CONVEYOR_SOURCE_DIR) + "/tests/fuzz/corpus/stream_reader_fuzzer";

std::vector<std::string> Records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at + 4 <= bytes.size()) {
    uint32_t len;
    std::memcpy(&len, bytes.data() + at, 4);
    at += 4;
    len = static_cast<uint32_t>(std::min<size_t>(len, bytes.size() - at));
    out.push_back(bytes.substr(at, len));
    at += len;
  }
  return out;
}

std::vector<std::string> CorpusFiles() {
  std::vector<std::string> names;
  DIR* d = ::opendir(kCorpus.c_str());
  while (d != nullptr) {
    dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  if (d != nullptr) ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Replays records on a Stream call: finishes OK after them when the last is an end of
// stream or `finish` is set; otherwise holds the call open until the client cancels it (or
// 10 s pass).
class Replay : public grpc::ServerGenericBidiReactor {
 public:
  Replay(std::vector<std::string> records, bool finish, grpc::Status status)
      : records_(std::move(records)), finish_(finish), status_(std::move(status)) {
    StartRead(&in_);
    Next();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return;  // cancelled: OnCancel finishes
    Next();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      cv_.notify_all();
    }
    if (holder_.joinable()) holder_.join();
    delete this;
  }

 private:
  void Next() {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ < records_.size()) {
      grpc::Slice slice(records_[next_]);
      out_ = grpc::ByteBuffer(&slice, 1);
      ++next_;
      StartWrite(&out_);
      return;
    }
    v1::StreamResponse last;
    if (finish_ || (!records_.empty() && last.ParseFromString(records_.back()) && last.has_end())) {
      FinishLocked(status_);
      return;
    }
    holder_ = std::thread([this] {
      std::unique_lock<std::mutex> hold(mu_);
      cv_.wait_for(hold, std::chrono::seconds(10), [&] { return cancelled_; });
      FinishLocked(grpc::Status::OK);
    });
  }
  void FinishLocked(const grpc::Status& st) {
    if (finished_) return;
    finished_ = true;
    Finish(st);
  }

  const std::vector<std::string> records_;
  const bool finish_;
  const grpc::Status status_;
  grpc::ByteBuffer in_, out_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0;
  bool cancelled_ = false;
  bool finished_ = false;
  std::thread holder_;
};

class FakeDaemon : public grpc::CallbackGenericService {
 public:
  FakeDaemon() {
    grpc::ServerBuilder b;
    ConfigureServerBuilder(
        &b, ServiceOptions{});  // the daemon's keepalive settings: clients ping often
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeDaemon() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
  // What the next Stream call replays, and the status it ends with when it ends.
  void Serve(std::vector<std::string> records, bool finish = false,
             grpc::Status status = grpc::Status::OK) {
    std::lock_guard<std::mutex> lock(mu_);
    records_ = std::move(records);
    finish_ = finish;
    status_ = std::move(status);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx->method() != "/conveyor.v1.Loader/Stream")
      return new Replay({}, true, grpc::Status::OK);
    return new Replay(records_, finish_, status_);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> records_;
  bool finish_ = false;
  grpc::Status status_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct Outcome {
  absl::Status status;
  uint64_t batches = 0;
  double seconds = 0;
};

Outcome Read(const std::string& address) {
  Outcome out;
  auto client = Client::Connect(address);
  v1::Subscribe s;
  s.set_dataset("any");
  s.set_minibatch_size(1);
  SubscribeOptions once;
  once.reconnect = false;
  auto sub = (*client)->Subscribe(s, once);
  const auto t0 = std::chrono::steady_clock::now();
  ReceivedBatch b;
  while (true) {
    auto more = (*sub)->Next(&b);
    if (!more.ok()) {
      out.status = more.status();
      break;
    }
    if (!*more) break;
    ++out.batches;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

uint64_t BatchMessages(const std::vector<std::string>& records) {
  uint64_t n = 0;
  for (const std::string& r : records) {
    v1::StreamResponse m;
    if (m.ParseFromString(r) && m.has_batch()) ++n;
  }
  return n;
}

// What a malformed corpus stream must end in (tests/python/test_hostile_server.py expects
// the same): a silent OK end is a broken stream, resumable (UNAVAILABLE); a size past the
// client's limits RESOURCE_EXHAUSTED; any other violation INVALID_ARGUMENT.
absl::StatusCode ExpectedCode(const std::string& name) {
  if (name.find("ok-end") != std::string::npos) return absl::StatusCode::kUnavailable;
  if (name == "bad-claims-64-gib.bin" || name == "bad-segment-huge.bin")
    return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kInvalidArgument;
}

TEST(HostileServer, EveryCorpusStreamIsReadOrRefusedWithinSeconds) {
  FakeDaemon daemon;
  const auto files = CorpusFiles();
  ASSERT_GE(files.size(), 50u);
  for (const std::string& name : files) {
    const auto records = Records(ReadFile(kCorpus + "/" + name));
    // bad-ok-end-*: the daemon ends the call with OK after the records (a silent end);
    // the others hold it open: the client must see the violation itself.
    daemon.Serve(records, name.find("ok-end") != std::string::npos);
    const Outcome got = Read(daemon.address());
    EXPECT_LT(got.seconds, 5.0) << name << ": the client waited for the daemon to end the call";
    if (name.rfind("ok-", 0) == 0) {
      EXPECT_TRUE(got.status.ok()) << name << ": " << got.status;
      EXPECT_EQ(got.batches, BatchMessages(records)) << name;
    } else {
      EXPECT_EQ(got.status.code(), ExpectedCode(name))
          << name << ": " << got.status << " after " << got.batches << " batches";
    }
  }
}

// A daemon that cancels the call itself (as gRPC does to the calls a shutting-down server
// has not ended) breaks the stream like a daemon that went away: UNAVAILABLE, resumable from
// the cursor, not the CANCELLED of a client's own cancel.
TEST(HostileServer, ACallTheDaemonCancelsIsABrokenStream) {
  FakeDaemon daemon;
  auto records = Records(ReadFile(kCorpus + "/ok-sparse-csc.bin"));
  records.pop_back();  // no end of stream
  daemon.Serve(records, true, grpc::Status(grpc::StatusCode::CANCELLED, "Cancelled"));
  const Outcome got = Read(daemon.address());
  EXPECT_EQ(got.batches, BatchMessages(records));
  EXPECT_EQ(got.status.code(), absl::StatusCode::kUnavailable) << got.status;
  EXPECT_NE(got.status.message().find("cancelled the stream"), std::string::npos) << got.status;
}

// A fake descriptor socket that hands out one descriptor to whoever sends 16 bytes.
class FdSocket {
 public:
  FdSocket(const std::string& path, int fd) : path_(path), fd_(fd) {
    listen_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_, 4);
    thread_ = std::thread([this] {
      const int c = ::accept(listen_, nullptr, nullptr);
      if (c < 0) return;
      char token[16];
      size_t got = 0;
      while (got < 16) {
        const ssize_t n = ::recv(c, token + got, 16 - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      SendDescriptor(c, fd_);  // what the daemon's descriptor server sends, but any descriptor
      ::close(c);
    });
  }
  ~FdSocket() {
    ::shutdown(listen_, SHUT_RDWR);
    ::close(listen_);
    thread_.join();
    ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  int fd_;
  int listen_;
  std::thread thread_;
};

// The first batch of ok-sparse-csc.bin moved into a memfd segment: an announcement, the
// batch (shm slot at offset 0) and an end.
std::vector<std::string> ShmStream(int fd, uint64_t bytes, const std::string& fd_socket) {
  const auto records = Records(ReadFile(kCorpus + "/ok-sparse-csc.bin"));
  v1::StreamResponse batch;
  EXPECT_TRUE(batch.ParseFromString(records[0]) && batch.has_batch());
  const std::string& payload = batch.batch().payload().data();
  EXPECT_EQ(::pwrite(fd, payload.data(), payload.size(), 0), static_cast<ssize_t>(payload.size()));
  batch.mutable_batch()->clear_payload();
  batch.mutable_batch()->set_parts(0);
  batch.mutable_batch()->mutable_shm()->set_segment(0);
  batch.mutable_batch()->mutable_shm()->set_offset(0);
  v1::StreamResponse segment;
  segment.mutable_segment()->set_id(0);
  segment.mutable_segment()->set_bytes(bytes);
  segment.mutable_segment()->set_token(std::string(16, 't'));
  segment.mutable_segment()->set_fd_socket(fd_socket);
  v1::StreamResponse end;
  end.mutable_end()->set_batches(1);
  end.mutable_end()->set_cursor(batch.batch().cursor());
  return {segment.SerializeAsString(), batch.SerializeAsString(), end.SerializeAsString()};
}

TEST(HostileServer, SharedMemoryMustBeSealedAgainstShrinking) {
  TempDir dir;
  FakeDaemon daemon;
  struct Case {
    const char* what;
    unsigned seals;
    uint64_t size, announced;
    bool accepted;
  };
  for (const Case& c : {Case{"sealed", F_SEAL_SHRINK | F_SEAL_GROW, 65536, 65536, true},
                        Case{"not sealed", 0, 65536, 65536, false},
                        Case{"smaller than announced", F_SEAL_SHRINK, 4096, 65536, false}}) {
    const int fd = ::memfd_create("hostile", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(c.size)), 0);
    if (c.seals) {
      ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, c.seals), 0);
    }
    const std::string path = dir.path() + "/fd.sock";
    FdSocket socket(path, fd);
    daemon.Serve(ShmStream(fd, c.announced, path));
    const Outcome got = Read(daemon.address());
    if (c.accepted) {
      EXPECT_TRUE(got.status.ok()) << c.what << ": " << got.status;
      EXPECT_EQ(got.batches, 1u) << c.what;
    } else {
      EXPECT_EQ(got.status.code(), absl::StatusCode::kInvalidArgument)
          << c.what << ": " << got.status;
      EXPECT_EQ(got.batches, 0u);
    }
    if (!c.seals) {
      // What a hostile daemon would do next: truncate it under the client's mapping. The
      // client never mapped it, so it lives on.
      EXPECT_EQ(::ftruncate(fd, 0), 0);
    }
    ::close(fd);
  }
}

}  // namespace
}  // namespace conveyor::testing
