// The transports on their own, without a service: where batches go, what is announced
// before them, and when memory and budget are given back (server/transports/).
#include "server/transports/transport.h"

#include <grpcpp/support/byte_buffer.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "client/cpp/shared_segment.h"
#include "server/shared_memory.h"
#include "server/transports/inline_transport.h"
#include "server/transports/pooled_transport.h"
#include "cuda/slot_pool.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace conveyor {
namespace {

v1::Subscribe SubscribeWith(v1::Transport transport) {
  v1::Subscribe s;
  s.set_transport(transport);
  return s;
}

v1::StreamResponse Descriptor() {
  v1::StreamResponse first;
  first.mutable_batch()->set_serial(0);
  return first;
}

TEST(Transport, AnUnknownKindIsInvalidArgument) {
  ServiceOptions o;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(static_cast<v1::Transport>(7)), TransportEnv{&o, &budget, 2});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "unknown transport 7");
}

TEST(Transport, SharedMemoryNeedsTheDaemonsSocket) {
  ServiceOptions o;  // no fd_server
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_SHARED_MEMORY), TransportEnv{&o, &budget, 2});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "shared memory needs the daemon's unix socket (started without one)");
}

TEST(Transport, CudaIpcWithoutADeviceIsFailedPrecondition) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "this host has a CUDA device";
  ServiceOptions o;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_CUDA_IPC), TransportEnv{&o, &budget, 2});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("TRANSPORT_CUDA_IPC needs a CUDA device on the daemon's host"),
            std::string::npos)
      << t.status();
}

TEST(Transport, ABatchPastTheSubscriptionBudgetIsRefusedBeforeAnyMemory) {
  ServiceOptions o;
  o.subscription_bytes = 1000;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 2});
  ASSERT_TRUE(t.ok()) << t.status();
  auto d = (*t)->Reserve(3, 501);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status().message(),
            "batch 3 of 501 bytes x 2 credits exceeds the subscription budget server.subscriptionBytes (1000 "
            "bytes): ask for fewer credits or smaller batches (a sparse stream as CSC or CSR rather than dense)");
  EXPECT_EQ(budget.used(), 0u);
}

TEST(InlineTransport, PartsReferenceOneBufferFreedWithTheLastOfThem) {
  ServiceOptions o;
  o.inline_part_bytes = 100;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 2});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_STREQ((*t)->name(), "inline");
  auto d = (*t)->Reserve(0, 250);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(budget.used(), 250u);
  for (size_t i = 0; i < 250; ++i) (*d)->bytes[i] = static_cast<std::byte>(i);
  std::vector<OutgoingMessage> out;
  (*t)->Describe(std::move(*d), Descriptor(), &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].message.batch().parts(), 3u);
  EXPECT_EQ(out[1].message.more().payload().offset(), 100u);
  EXPECT_EQ(out[2].message.more().payload().offset(), 200u);
  std::string all;
  for (OutgoingMessage& m : out) {
    m.Materialize();
    all += m.message.has_batch() ? m.message.batch().payload().data() : m.message.more().payload().data();
  }
  ASSERT_EQ(all.size(), 250u);
  for (size_t i = 0; i < 250; ++i) EXPECT_EQ(static_cast<unsigned char>(all[i]), i);
  EXPECT_EQ(budget.used(), 250u);  // the parts still hold the buffer
  out.clear();
  EXPECT_EQ(budget.used(), 0u);
}

// A descriptor with most of its fields set, some numbered after `payload` (17).
v1::StreamResponse RichDescriptor(uint64_t serial) {
  v1::StreamResponse first;
  v1::BatchDescriptor* d = first.mutable_batch();
  d->set_serial(serial);
  d->set_epoch(3);
  d->set_batch(7);
  d->set_end_of_epoch(true);
  d->set_cursor(std::string(300, 'c'));  // a length of two varint bytes
  d->set_rows(4);
  d->set_samples(4);
  d->set_precision(v1::PRECISION_DOUBLE);
  for (int i = 0; i < 200; ++i) d->mutable_pieces()->add_row(i);
  return first;
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& x : slices) s.append(reinterpret_cast<const char*>(x.begin()), x.size());
  return s;
}

// Encode() writes exactly protobuf's bytes of the message with its part as the payload's data
// (the Python client parses them with protobuf), the part itself from the batch's buffer.
TEST(InlineTransport, EncodedPartsAreProtobufsBytesSentFromTheBuffer) {
  for (uint64_t total : {0u, 1u, 100u, 250u, 20000u}) {
    ServiceOptions o;
    o.inline_part_bytes = total > 1000 ? 16384 : 100;
    MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
    auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 2});
    ASSERT_TRUE(t.ok()) << t.status();
    auto d = (*t)->Reserve(5, total);
    ASSERT_TRUE(d.ok()) << d.status();
    const std::byte* data = (*d)->bytes.data();
    for (size_t i = 0; i < total; ++i) (*d)->bytes[i] = static_cast<std::byte>(i * 7);
    v1::StreamResponse first = RichDescriptor(5);
    first.mutable_batch()->set_total_bytes(total);
    std::vector<OutgoingMessage> out;
    (*t)->Describe(std::move(*d), first, &out);
    std::vector<grpc::ByteBuffer> wire;
    for (OutgoingMessage& m : out) {
      OutgoingMessage copy{m.message, m.payload, m.offset, m.size, m.memory};
      copy.Materialize();
      wire.push_back(m.Encode());
      EXPECT_EQ(Flatten(wire.back()), copy.message.SerializeAsString()) << total << " bytes, part at " << m.offset;
      // The part's bytes are a slice over the buffer itself.
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(wire.back().Dump(&slices).ok());
      bool in_place = m.size == 0;
      for (const grpc::Slice& x : slices) {
        in_place |= reinterpret_cast<const std::byte*>(x.begin()) == data + m.offset && x.size() == m.size;
      }
      EXPECT_TRUE(in_place) << total << " bytes, part at " << m.offset;
    }
    // Written (the messages gone), the budget is back; the pages live while gRPC holds them.
    out.clear();
    EXPECT_EQ(budget.used(), 0u);
    std::string all;
    v1::StreamResponse r;
    for (const grpc::ByteBuffer& b : wire) {
      ASSERT_TRUE(r.ParseFromString(Flatten(b)));
      all += r.has_batch() ? r.batch().payload().data() : r.more().payload().data();
    }
    ASSERT_EQ(all.size(), total);
    for (size_t i = 0; i < total; ++i) ASSERT_EQ(static_cast<unsigned char>(all[i]), (i * 7) & 0xff);
  }
}

TEST(InlineTransport, ABatchsPagesAreReusedOnceGRPCLetsGoOfThem) {
  ServiceOptions o;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 24);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 2});
  ASSERT_TRUE(t.ok()) << t.status();
  auto* inline_transport = static_cast<InlineTransport*>(t->get());
  auto a = (*t)->Reserve(0, 100000);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::byte* pages = (*a)->bytes.data();
  std::vector<OutgoingMessage> out;
  (*t)->Describe(std::move(*a), Descriptor(), &out);
  grpc::ByteBuffer sent = out[0].Encode();
  out.clear();  // written: the budget is back, the slice still holds the pages
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(inline_transport->idle_buffers(), 0u);
  auto b = (*t)->Reserve(1, 1000);  // new pages, the first batch's being in use
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*b)->bytes.data(), pages);
  sent.Clear();  // gRPC lets go
  EXPECT_EQ(inline_transport->idle_buffers(), 1u);
  auto c = (*t)->Reserve(2, 90000);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->bytes.data(), pages);
  EXPECT_EQ(inline_transport->idle_buffers(), 0u);
  EXPECT_EQ(budget.used(), 91000u);
}

TEST(InlineTransport, TheBufferGivenBackLastIsReusedFirst) {
  ServiceOptions o;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 24);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 4});
  ASSERT_TRUE(t.ok()) << t.status();
  // Three batches of one size in flight, given back in the order 1, 2, 0.
  std::vector<grpc::ByteBuffer> sent(3);
  std::vector<const std::byte*> pages;
  for (uint64_t serial = 0; serial < 3; ++serial) {
    auto d = (*t)->Reserve(serial, 50000);
    ASSERT_TRUE(d.ok()) << d.status();
    pages.push_back((*d)->bytes.data());
    std::vector<OutgoingMessage> out;
    (*t)->Describe(std::move(*d), Descriptor(), &out);
    sent[serial] = out[0].Encode();
  }
  for (size_t i : {1, 2, 0}) sent[i].Clear();
  // The next batches take them back last given first: the pages the kernel read last are
  // the likeliest to be cached still.
  std::vector<std::unique_ptr<Transport::Destination>> held;  // in use while held
  for (size_t expected : {0, 2, 1}) {
    auto d = (*t)->Reserve(3 + held.size(), 50000);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)->bytes.data(), pages[expected]);
    held.push_back(std::move(*d));
  }
}

TEST(Transport, MessagesWithoutAPartEncodeAsProtobufDoes) {
  OutgoingMessage end{v1::StreamResponse(), nullptr, 0, 0, nullptr};
  end.message.mutable_end()->set_cursor("abc");
  end.message.mutable_end()->set_batches(9);
  const std::string expected = end.message.SerializeAsString();
  EXPECT_EQ(Flatten(end.Encode()), expected);
  OutgoingMessage shm{RichDescriptor(1), nullptr, 0, 0, nullptr};
  shm.message.mutable_batch()->mutable_shm()->set_segment(2);
  shm.message.mutable_batch()->mutable_shm()->set_offset(4096);
  const std::string expected_shm = shm.message.SerializeAsString();
  EXPECT_EQ(Flatten(shm.Encode()), expected_shm);
}

class ShmTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fds = FdServer::Start(dir_.path() + "/fd.sock");
    ASSERT_TRUE(fds.ok()) << fds.status();
    fd_server_ = std::move(*fds);
    o_.fd_server = fd_server_.get();
    o_.min_slot_bytes = 256;
    o_.slot_headroom = 1.0;
    auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_SHARED_MEMORY), TransportEnv{&o_, &budget_, 2});
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
  }
  PooledTransport& pooled() { return *static_cast<PooledTransport*>(transport_.get()); }
  std::vector<OutgoingMessage> Describe(std::unique_ptr<Transport::Destination> d) {
    std::vector<OutgoingMessage> out;
    transport_->Describe(std::move(d), Descriptor(), &out);
    return out;
  }

  testing::TempDir dir_;
  ServiceOptions o_;
  MemoryBudget budget_{"the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20};
  std::unique_ptr<FdServer> fd_server_;
  std::unique_ptr<Transport> transport_;
};

TEST_F(ShmTransportTest, TheFirstBatchAnnouncesItsSegmentBeforeItself) {
  EXPECT_STREQ(transport_->name(), "shm");
  auto d = transport_->Reserve(0, 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<OutgoingMessage> out = Describe(std::move(*d));
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].message.has_segment());
  EXPECT_EQ(out[0].message.segment().id(), 0u);
  EXPECT_EQ(out[0].message.segment().bytes(), 2u * 1024);  // 2 credits x 1000 bytes rounded to 256
  EXPECT_EQ(out[0].message.segment().fd_socket(), fd_server_->path());
  EXPECT_EQ(out[0].message.segment().token().size(), 16u);
  ASSERT_TRUE(out[1].message.has_batch());
  EXPECT_EQ(out[1].message.batch().shm().segment(), 0u);
  EXPECT_EQ(out[1].message.batch().shm().offset(), 0u);
  EXPECT_EQ(budget_.used(), 2048u);
}

TEST_F(ShmTransportTest, BatchesThatFitShareTheSegmentAndAckedSlotsAreReused) {
  auto a = transport_->Reserve(0, 1000);
  auto b = transport_->Reserve(1, 900);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*b)->announcements.empty());
  std::vector<OutgoingMessage> out = Describe(std::move(*b));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.batch().shm().offset(), 1024u);
  EXPECT_EQ(transport_->Reserve(2, 100).status().code(), absl::StatusCode::kInternal);  // both slots held
  transport_->Release(0);
  auto c = transport_->Reserve(2, 100);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Describe(std::move(*c))[0].message.batch().shm().offset(), 0u);
  EXPECT_EQ(pooled().segments(), 1u);
}

TEST_F(ShmTransportTest, ALargerBatchGetsANewSegmentAndTheIdleOldOneIsReleased) {
  auto a = transport_->Reserve(0, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = transport_->Reserve(1, 3000);  // outgrows the 1024-byte slots
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->announcements.size(), 1u);
  EXPECT_EQ((*b)->announcements[0].segment().id(), 1u);
  EXPECT_EQ(pooled().segments(), 2u);  // segment 0 still holds batch 0
  EXPECT_EQ(budget_.used(), 2048u + 2 * 3072u);
  EXPECT_EQ(Describe(std::move(*b)).back().message.batch().shm().segment(), 1u);
  transport_->Release(0);
  transport_->Release(1);
  auto c = transport_->Reserve(2, 100);  // segment 0 is idle: released on the next batch
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->announcements.empty());
  EXPECT_EQ(pooled().segments(), 1u);
  EXPECT_EQ(pooled().bytes(), 2 * 3072u);
  EXPECT_EQ(budget_.used(), 2 * 3072u);
  transport_.reset();
  EXPECT_EQ(budget_.used(), 0u);
}

// --assembler cuda into host memory: the memory the inline and shm transports make for
// batches is page-locked for the device (so that each batch is copied back by DMA while the
// next is assembled), and only then. Without a device the CPU assembler serves and nothing
// is locked.
TEST(TransportGpu, HostMemoryIsPageLockedForTheCudaAssemblerOnly) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  testing::TempDir dir;
  auto fds = FdServer::Start(dir.path() + "/fd.sock");
  ASSERT_TRUE(fds.ok()) << fds.status();
  for (bool cuda : {true, false}) {
    for (v1::Transport kind : {v1::TRANSPORT_INLINE, v1::TRANSPORT_SHARED_MEMORY}) {
      SCOPED_TRACE(::testing::Message() << "cuda assembler " << cuda << ", transport " << kind);
      ServiceOptions o;
      o.cuda_assembler = cuda;
      o.fd_server = fds->get();
      MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 64 << 20);
      auto t = MakeTransport(SubscribeWith(kind), TransportEnv{&o, &budget, 2});
      ASSERT_TRUE(t.ok()) << t.status();
      auto assembler = (*t)->MakeAssembler();
      ASSERT_TRUE(assembler.ok()) << assembler.status();
      EXPECT_STREQ((*assembler)->name(), cuda ? "cuda" : "cpu");
      auto d = (*t)->Reserve(0, 3 << 20);
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(gpu::IsPageLocked((*d)->bytes.data(), (*d)->bytes.size()), cuda);
    }
  }
}

TEST(Transport, WithoutADeviceTheCudaAssemblerFallsBackAndNothingIsLocked) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "this host has a CUDA device; see TransportGpu";
  ServiceOptions o;
  o.cuda_assembler = true;
  MemoryBudget budget("the daemon's budget for batches in flight", "server.inFlightBytes", 1 << 20);
  auto t = MakeTransport(SubscribeWith(v1::TRANSPORT_INLINE), TransportEnv{&o, &budget, 2});
  ASSERT_TRUE(t.ok()) << t.status();
  auto assembler = (*t)->MakeAssembler();
  ASSERT_TRUE(assembler.ok()) << assembler.status();
  EXPECT_STREQ((*assembler)->name(), "cpu");
  auto d = (*t)->Reserve(0, 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(gpu::IsPageLocked((*d)->bytes.data(), (*d)->bytes.size()));
}

// Peers that connect to the descriptor socket and send their token a byte at a time, or
// nothing, hold no one up: each connection has one second in all, and they are served side by
// side (one peer dripping a byte every 0.8 s held the only connection served, and every
// subscriber's segment request waited behind it until it failed).
TEST(FdServer, SlowAndSilentPeersDelayNoClient) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/fd.sock";
  auto server = FdServer::Start(path);
  ASSERT_TRUE(server.ok()) << server.status();
  auto seg = ShmSegment::Create(4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto token = (*server)->Register(*seg);
  ASSERT_TRUE(token.ok()) << token.status();
  std::atomic<bool> stop{false};
  auto connect = [&] {
    const int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    (void)!::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    return c;
  };
  std::vector<std::thread> peers;
  for (int k = 0; k < 3; ++k) {
    peers.emplace_back([&, k] {  // drip a byte every 150 ms, reconnecting when closed
      int c = connect();
      while (!stop) {
        if (k == 0 || ::send(c, "x", 1, MSG_NOSIGNAL) != 1) {
          if (k != 0) {
            ::close(c);
            c = connect();
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
      }
      ::close(c);
    });
  }
  std::vector<int> silent;  // connected, never a byte
  for (int k = 0; k < 8; ++k) silent.push_back(connect());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Fetched and mapped as the client does (MapSharedSegment).
  v1::SharedMemorySegment announced;
  announced.set_bytes(4096);
  announced.set_token(*token);
  announced.set_fd_socket(path);
  for (int round = 0; round < 6; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    auto mapped = MapSharedSegment(announced);
    EXPECT_TRUE(mapped.ok()) << "round " << round << ": " << mapped.status();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500)) << "round " << round;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  announced.set_token(std::string(16, 'w'));  // a wrong token: closed, no descriptor
  EXPECT_FALSE(MapSharedSegment(announced).ok());
  stop = true;
  for (auto& t : peers) t.join();
  for (int c : silent) ::close(c);
}

}  // namespace
}  // namespace conveyor
