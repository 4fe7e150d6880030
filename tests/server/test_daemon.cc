#include "tests/server/test_daemon.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "common/batch/dump_writer.h"
#include "common/config/config_loader.h"
#include "gtest/gtest.h"

namespace conveyor::testing {

const std::string kExamples = std::string(CONVEYOR_SOURCE_DIR) + "/examples/conveyor.yaml";

Daemon::Daemon(ServiceOptions options, const std::string& config_path) {
  auto config = LoadConfigFile(config_path);
  EXPECT_TRUE(config.ok()) << config.status();
  auto registry = DatasetRegistry::Open(*config, 2);
  EXPECT_TRUE(registry.ok()) << registry.status();
  auto fds = FdServer::Start(dir_.path() + "/d.sock.fd");
  EXPECT_TRUE(fds.ok()) << fds.status();
  fd_server_ = std::move(*fds);
  options.fd_server = fd_server_.get();
  service_ = std::make_unique<LoaderService>(std::move(*registry), options);
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  socket_ = dir_.path() + "/d.sock";
  b.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
  ConfigureServerBuilder(&b, options);
  b.SetMaxReceiveMessageSize(1 << 20);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
}

Daemon::~Daemon() {
  service_->Drain();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
}

v1::Subscribe Sub(const std::string& dataset, uint64_t mb, bool randomize, uint64_t seed) {
  v1::Subscribe s;
  s.set_dataset(dataset);
  s.set_minibatch_size(mb);
  s.set_randomize(randomize);
  s.set_seed(seed);
  return s;
}

absl::StatusOr<std::string> Drain(Subscription* sub, uint64_t max_batches) {
  std::string out;
  ReceivedBatch b;
  for (uint64_t n = 0; n < max_batches; ++n) {
    auto more = sub->Next(&b);
    if (!more.ok()) return more.status();
    if (!*more) break;
    AppendDump(b.descriptor().epoch(), b.descriptor().batch(), b.plan(), b.bytes(), b.cursor(), &out);
  }
  return out;
}

std::string LocalDump(const std::string& dataset, uint64_t mb, const StreamRequest& extra,
                      const std::string& config_path) {
  auto config = LoadConfigFile(config_path);
  EXPECT_TRUE(config.ok()) << config.status();
  ReadOptions ro;
  ro.minibatch_size = mb;
  ro.epochs = extra.epochs;
  ro.cursors = true;
  ro.request = extra;
  if (!ro.request.randomize) ro.request.randomize = true;
  if (!ro.request.seed) ro.request.seed = 3;
  auto out = DumpDataset(*config->Find(dataset), ro);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

std::multiset<std::string> Keys(const std::string& dump) {
  std::multiset<std::string> keys;
  std::istringstream in(dump);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"key\":\"");
    if (at != std::string::npos) keys.insert(line.substr(at + 7, line.find('"', at + 7) - at - 7));
  }
  return keys;
}

grpc::Status RawStream(const std::string& address, const std::vector<v1::StreamRequest>& requests) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Loader::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Stream(&ctx);
  for (const auto& r : requests) stream->Write(r);
  v1::StreamResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_end()) break;
  }
  stream->WritesDone();
  return stream->Finish();
}

v1::StreamRequest SubscribeRequest(const v1::Subscribe& s) {
  v1::StreamRequest r;
  *r.mutable_subscribe() = s;
  return r;
}

bool WaitFor(double seconds, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace conveyor::testing
