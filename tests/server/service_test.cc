// conveyord's service against real gRPC servers on 127.0.0.1 port 0 and on a unix socket,
// with the real C++ client: what a subscriber receives is what `conveyor dump` prints; ranks
// split the data; credits bound a stalled subscriber; bad requests are refused.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/conveyor_client.h"
#include "client/cpp/shared_segment.h"
#include "common/batch/dump_writer.h"
#include "common/config/config_loader.h"
#include "gtest/gtest.h"
#include "cuda/cuda_backend.h"
#include "server/loader_service.h"
#include "tests/server/test_daemon.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

// Truncated BPTT (5 steps, 4 parallel sequences) over "sequences": what dump prints.
void ExpectTruncatedStreamMatchesDump(Client* client) {
  v1::Subscribe t = Sub("sequences", 40);
  t.set_truncation(5);
  t.set_parallel(4);
  auto bptt = client->Subscribe(t);
  ASSERT_TRUE(bptt.ok()) << bptt.status();
  auto tgot = Drain(bptt->get());
  ASSERT_TRUE(tgot.ok()) << tgot.status();
  StreamRequest extra;
  extra.truncation = 5;
  extra.parallel = 4;
  EXPECT_EQ(*tgot, LocalDump("sequences", 40, extra));
}

TEST(Service, ListsAndDescribesDatasets) {
  Daemon d;
  auto client = Client::Connect(d.tcp());
  auto names = (*client)->ListDatasets();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"sequences", "simple", "sparse"}));
  auto desc = (*client)->Describe("sparse");
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->sequences(), 2000u);
  ASSERT_EQ(desc->streams_size(), 2);
  EXPECT_EQ(desc->streams(0).name(), "words");
  EXPECT_EQ(desc->streams(0).alias(), "x");
  EXPECT_EQ(desc->streams(0).format(), v1::FORMAT_SPARSE);
  EXPECT_EQ(desc->streams(0).dim(), 5000u);
  EXPECT_EQ(desc->randomization_window(), 128u);  // 4 GiB of 32 MiB chunks
  EXPECT_FALSE(desc->randomization_window_in_samples());
  auto missing = (*client)->Describe("../etc/passwd");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// maxErrors: a bad sequence is left out of its batch, and the batch says how many were
// (BatchDescriptor.dropped), so a trainer can tell a short batch from the end of the data.
TEST(Service, BatchesSayHowManyBadSequencesTheyLeftOut) {
  TempDir dir;
  std::string ctf;
  for (int i = 0; i < 10; ++i) ctf += (i == 3 || i == 7) ? "|x 1 abc\n" : "|x " + std::to_string(i) + " 0.5\n";
  const std::string file = dir.Write("bad.ctf", ctf);
  const std::string config = dir.Write(
      "bad.yaml", "datasets:\n  bad:\n    randomize: false\n    maxErrors: 2\n    deserializers:\n"
                  "      - type: CNTKTextFormat\n        file: " + file + "\n        input:\n          x: {dim: 2, format: dense}\n");
  Daemon d({}, config);
  auto client = Client::Connect(d.tcp());
  ASSERT_TRUE(client.ok());
  auto sub = (*client)->Subscribe(Sub("bad", 4, /*randomize=*/false));
  ASSERT_TRUE(sub.ok());
  // Lines 0-3, 4-7, 8-9 in minibatches of 4 samples; lines 3 and 7 are bad.
  std::vector<uint32_t> rows, dropped;
  std::vector<float> first;
  ReceivedBatch b;
  while (true) {
    auto more = (*sub)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    rows.push_back(b.descriptor().rows());
    dropped.push_back(b.descriptor().dropped());
    float v;
    std::memcpy(&v, b.bytes().data() + b.descriptor().streams(0).values().offset(), sizeof v);
    first.push_back(v);
  }
  EXPECT_EQ(rows, (std::vector<uint32_t>{3, 3, 2}));
  EXPECT_EQ(dropped, (std::vector<uint32_t>{1, 1, 0}));
  EXPECT_EQ(first, (std::vector<float>{0, 4, 8}));
}

// maxErrors is the dataset's budget for as long as the daemon has it open: the subscription
// whose read breaks it is told so; a later one, re-reading the bad sequence that was within
// budget then, is told which error broke it and what to do, not "more than maxErrors" at an
// error that was not.
TEST(Service, ABrokenErrorBudgetSaysWhichErrorBrokeIt) {
  TempDir dir;
  const std::string file = dir.Write("bad.ctf", "|x 1 2\n|x 1 abc\n|x 3 4\n|x 5 def\n|x 7 8\n");
  const std::string config = dir.Write(
      "bad.yaml", "datasets:\n  bad:\n    randomize: false\n    maxErrors: 1\n    deserializers:\n"
                  "      - type: CNTKTextFormat\n        file: " + file + "\n        input:\n          x: {dim: 2, format: dense}\n");
  Daemon d({}, config);
  auto client = Client::Connect(d.tcp());
  ASSERT_TRUE(client.ok());
  auto read = [&] {
    auto sub = (*client)->Subscribe(Sub("bad", 2, /*randomize=*/false));
    ReceivedBatch b;
    while (true) {
      auto more = (*sub)->Next(&b);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
    }
  };
  const absl::Status first = read();
  EXPECT_EQ(first.code(), absl::StatusCode::kDataLoss) << first;
  EXPECT_NE(first.message().find("bad.ctf:4:6: unexpected 'd': expected a number for input 'x' (more than maxErrors=1 "
                                 "input errors; raise maxErrors to skip bad sequences)"),
            std::string::npos)
      << first;
  const absl::Status again = read();
  EXPECT_EQ(again.code(), absl::StatusCode::kDataLoss) << again;
  EXPECT_NE(again.message().find("bad.ctf:2:6: unexpected 'a': expected a number for input 'x' (the dataset's "
                                 "maxErrors=1 was exceeded earlier, first by: "),
            std::string::npos)
      << again;
  EXPECT_NE(again.message().find("first by: " + file + ":4:6:"), std::string::npos) << again;
  EXPECT_NE(again.message().find("open the dataset again (a daemon: restart it)"), std::string::npos) << again;
}

TEST(Service, SubscribeDeliversWhatDumpPrintsOverTcpAndUnix) {
  ServiceOptions o;
  o.inline_part_bytes = 4096;  // several messages a batch: exercises reassembly
  Daemon d(o);
  const std::string expected = LocalDump("sparse", 128);
  for (const std::string& address : {d.tcp(), d.unix_socket()}) {
    auto client = Client::Connect(address);
    auto sub = (*client)->Subscribe(Sub("sparse", 128));
    auto got = Drain(sub->get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, expected) << address;
  }
}

// HTK features with an 11-frame context window and MLF labels (the AN4 subset of tests/data):
// the daemon leaves the frames in the file and builds the windows as it assembles, and what
// arrives, inline and through shared memory, utterances and frames, is what decoding into
// the chunk gives (the local dump).
TEST(Service, HtkWindowsBuiltAtAssemblyArriveAsDumpPrintsThem) {
  TempDir dir;
  const std::string an4 = TestdataDir() + "/cntk/HTK/an4_first3_reconstructed";
  const std::string config = dir.Write("htk.yaml", absl::StrCat(R"(datasets:
  an4:
    deserializers:
      - type: HTKFeature
        chunkSizeInBytes: 100000
        input: {features: {scpFile: ")", an4, R"(/an4_first3.scp", dim: 363, contextWindow: 11}}
      - type: HTKMLF
        input: {labels: {mlfFile: ")", an4, R"(/an4_first3.mlf", labelMappingFile: ")", an4,
                                                                R"(/state.list", labelDim: 132}}
)"));
  Daemon d({}, config);
  auto client = Client::Connect(d.unix_socket());
  ASSERT_TRUE(client.ok()) << client.status();
  for (bool frames : {false, true}) {
    for (bool shm : {false, true}) {
      SCOPED_TRACE(absl::StrCat(frames ? "frames" : "utterances", shm ? ", shared memory" : ", inline"));
      v1::Subscribe s = Sub("an4", frames ? 128 : 500);
      s.set_frame_mode(frames);
      if (shm) s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
      auto sub = (*client)->Subscribe(s);
      ASSERT_TRUE(sub.ok()) << sub.status();
      auto got = Drain(sub->get());
      ASSERT_TRUE(got.ok()) << got.status();
      StreamRequest extra;
      extra.frame_mode = frames;
      const std::string want = LocalDump("an4", frames ? 128 : 500, extra, config);
      EXPECT_GT(want.size(), 100000u);
      EXPECT_EQ(*got, want);
    }
  }
}

// Values narrowed on request (float16, bfloat16) pass the client's checks and arrive as the
// local dump prints them; the typed views insist on the values' own type: uint16_t bit
// patterns for a narrowed stream, float for the others.
TEST(Service, NarrowedValuesArriveAsDumpPrintsThem) {
  Daemon d;
  auto client = Client::Connect(d.tcp());
  for (const char* dataset : {"simple", "sparse"}) {
    v1::Subscribe s = Sub(dataset, 100);
    StreamRequest extra;
    const std::string first = std::string(dataset) == "simple" ? "features" : "words";
    const std::string second = std::string(dataset) == "simple" ? "labels" : "label";
    (*s.mutable_dtypes())[first] = v1::DTYPE_FLOAT16;
    (*s.mutable_dtypes())[second] = v1::DTYPE_BFLOAT16;
    extra.value_dtypes[first] = DType::kFloat16;
    extra.value_dtypes[second] = DType::kBFloat16;
    auto sub = (*client)->Subscribe(s);
    auto got = Drain(sub->get());
    ASSERT_TRUE(got.ok()) << dataset << ": " << got.status();
    EXPECT_EQ(*got, LocalDump(dataset, 100, extra)) << dataset;
  }
  v1::Subscribe s = Sub("simple", 10);
  (*s.mutable_dtypes())["features"] = v1::DTYPE_FLOAT16;
  auto sub = (*client)->Subscribe(s);
  ReceivedBatch b;
  ASSERT_TRUE(*(*sub)->Next(&b));
  const int features = b.StreamIndex("features"), labels = b.StreamIndex("labels");
  auto as_float = b.Dense<float>(features);
  EXPECT_EQ(as_float.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as_float.status().message(), "stream 'features' holds float16 values: read them as uint16_t (the bit patterns)");
  auto bits = b.Dense<uint16_t>(features);
  ASSERT_TRUE(bits.ok()) << bits.status();
  EXPECT_EQ(bits->rows, 10u);
  EXPECT_EQ(b.Dense<uint16_t>(labels).status().message(), "stream 'labels' holds float32 values: read them as float");
  EXPECT_TRUE(b.Dense<float>(labels).ok());
}

TEST(Service, SequencesAndTruncatedStreamsMatchDumpToo) {
  Daemon d;
  auto client = Client::Connect(d.tcp());
  auto seq = (*client)->Subscribe(Sub("sequences", 40));
  auto got = Drain(seq->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, LocalDump("sequences", 40));
  ExpectTruncatedStreamMatchesDump(client->get());
}

TEST(Service, SixteenConcurrentRanksAreDisjointAndComplete) {
  Daemon d;
  std::vector<std::string> outs(16);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (uint32_t r = 0; r < 16; ++r) {
    threads.emplace_back([&, r] {
      auto client = Client::Connect(r % 2 ? d.tcp() : d.unix_socket());
      v1::Subscribe s = Sub("sparse", 100);
      s.set_rank(r);
      s.set_world(16);
      auto sub = (*client)->Subscribe(s);
      auto got = Drain(sub->get());
      if (!got.ok()) ++failures;
      else outs[r] = *got;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  std::multiset<std::string> all;
  for (const auto& o : outs) {
    auto k = Keys(o);
    all.insert(k.begin(), k.end());
  }
  EXPECT_EQ(all.size(), 2000u);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 2000u);
}

TEST(Service, AStalledSubscriberDoesNotHoldUpOthers) {
  Daemon d;
  auto client = Client::Connect(d.tcp());
  // The stalled one takes one batch and never asks for (or acks) another.
  v1::Subscribe stalled = Sub("sparse", 10);
  stalled.set_initial_credits(1);
  stalled.set_epochs(1000);
  auto slow = (*client)->Subscribe(stalled);
  ReceivedBatch first;
  ASSERT_TRUE(*(*slow)->Next(&first));
  const auto t0 = std::chrono::steady_clock::now();
  v1::Subscribe fast = Sub("sparse", 200);
  fast.set_epochs(20);
  auto other = (*client)->Subscribe(fast);
  auto got = Drain(other->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Keys(*got).size(), 40000u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(d.service().active_streams(), 1u);  // the stalled one, still open and bounded
}

// A client that acks batches it has not read (they wait behind HTTP/2 flow control) gets
// its credits back, but the daemon publishes no more batches while its credits' worth are
// still unsent: what it queues for one subscription stays bounded (an earlier daemon queued
// another batch at every such ack: gigabytes, past subscriptionBytes). Here the acks of the
// four batches published come back at once; the fifth batch is never published, so an ack
// for it is refused as not outstanding.
TEST(Service, AcksForBatchesNotYetSentDoNotQueueMore) {
  TempDir dir;
  std::string row = "|x";
  for (int i = 0; i < 1000; ++i) row += " 1";
  row += "\n";
  std::string text;
  for (int i = 0; i < 6000; ++i) text += row;
  const std::string file = dir.Write("big.ctf", text);  // batches of 1000 rows: 4 MB each
  const std::string config = dir.Write(
      "big.yaml", "datasets:\n  big:\n    randomize: false\n    deserializers:\n      - type: CNTKTextFormat\n"
                  "        file: " + file + "\n        input:\n          x: {dim: 1000, format: dense}\n");
  Daemon d({}, config);
  // A receive window that stays small (no BDP probing): what the client does not read stays
  // at the daemon.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 65536);
  auto stub = v1::Loader::NewStub(grpc::CreateCustomChannel(d.tcp(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Stream(&ctx);
  v1::Subscribe s = Sub("big", 1000, /*randomize=*/false);
  s.set_initial_credits(4);
  s.set_epochs(100);
  ASSERT_TRUE(stream->Write(SubscribeRequest(s)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // batches 0-3 published, unread
  auto ack = [&](uint64_t serial) {
    v1::StreamRequest r;
    r.mutable_ack()->set_serial(serial);
    return stream->Write(r);
  };
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(ack(k));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // time to publish batch 4, were it allowed
  ack(4);
  v1::StreamResponse resp;
  while (stream->Read(&resp)) {
  }
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("ack for batch 4, which is not outstanding"), std::string::npos)
      << st.error_message();
}

// A stream that has sent its end holds its subscription slot until the client closes its
// side; a client that never does (it read the end and sat idle) no longer holds it for good:
// the call finishes OK once every batch is acknowledged and end_grace_ms passed, or
// end_idle_ms after the last acknowledgement while some are not.
TEST(Service, AnEndedStreamWhoseClientNeverClosesFinishesAfterAGrace) {
  ServiceOptions o;
  o.end_grace_ms = 300;
  o.end_idle_ms = 2500;
  Daemon d(o);
  auto stub = v1::Loader::NewStub(grpc::CreateChannel(d.tcp(), grpc::InsecureChannelCredentials()));
  for (const bool ack_all : {true, false}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = stub->Stream(&ctx);
    v1::Subscribe s = Sub("simple", 250, /*randomize=*/false);
    s.set_initial_credits(64);
    ASSERT_TRUE(stream->Write(SubscribeRequest(s)));
    v1::StreamResponse resp;
    bool ended = false;
    while (!ended && stream->Read(&resp)) {
      ended = resp.has_end();
      if (resp.has_batch() && (ack_all || resp.batch().serial() > 0)) {  // batch 0 left unacknowledged
        v1::StreamRequest r;
        r.mutable_ack()->set_serial(resp.batch().serial());
        ASSERT_TRUE(stream->Write(r));
      }
    }
    ASSERT_TRUE(ended);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(stream->Read(&resp));  // no WritesDone: the daemon ends the call
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const grpc::Status st = stream->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
    if (ack_all) {
      EXPECT_LT(waited, 5.0);
    } else {
      EXPECT_GT(waited, 1.5);  // an unacknowledged batch: the longer wait
      EXPECT_LT(waited, 10.0);
    }
    EXPECT_TRUE(WaitFor(5, [&] { return d.service().active_streams() == 0; }));
  }
}

// A sparse stream's columns as sorted (index, value) lists: the form every layout must
// agree on. From CSC, CSR or dense (nonzeros) views, each computed independently here.
using Columns = std::vector<std::vector<std::pair<int32_t, float>>>;

Columns FromCsc(const CscView<float>& v) {
  Columns c(v.columns);
  for (uint64_t j = 0; j < v.columns; ++j) {
    std::map<int32_t, float> summed;  // repeated indices add up, as in the dense layout
    for (int64_t k = v.begin(j); k < v.begin(j + 1); ++k) summed[v.rowind[k]] += v.values[k];
    c[j].assign(summed.begin(), summed.end());
  }
  return c;
}

Columns FromCsr(const CsrView<float>& v) {
  std::vector<std::map<int32_t, float>> summed(v.columns);
  for (uint64_t r = 0; r < v.dim; ++r) {
    for (int64_t k = v.begin(r); k < v.begin(r + 1); ++k) {
      if (k > v.begin(r)) {
        EXPECT_LE(v.colind[k - 1], v.colind[k]) << "CSR columns must ascend within a row";
      }
      summed[v.colind[k]][static_cast<int32_t>(r)] += v.values[k];
    }
  }
  Columns c(v.columns);
  for (uint64_t j = 0; j < v.columns; ++j) c[j].assign(summed[j].begin(), summed[j].end());
  return c;
}

Columns FromDense(const DenseView<float>& v) {
  Columns c(v.rows * v.steps);
  for (uint64_t j = 0; j < c.size(); ++j) {
    for (uint64_t i = 0; i < v.dim; ++i) {
      const float x = v.data[j * v.dim + i];
      if (x != 0.0f) c[j].emplace_back(static_cast<int32_t>(i), x);
    }
  }
  return c;
}

Columns WithoutZeros(Columns c) {
  for (auto& col : c) col.erase(std::remove_if(col.begin(), col.end(), [](const auto& e) { return e.second == 0.0f; }), col.end());
  return c;
}

// Every batch of a sparse stream asked for as CSR and as dense (over inline and shared
// memory) holds the same matrix as the native CSC batch; the dense stream beside it is
// untouched; and `subscribe --dump` of a CSR stream equals the local dump with that layout.
TEST(Service, LayoutsDeliverTheSameMatrixAsCsrAndDense) {
  Daemon d;
  for (const std::string& address : {d.tcp(), d.unix_socket()}) {
    auto client = Client::Connect(address);
    ASSERT_TRUE(client.ok());
    const bool shm = address == d.unix_socket();
    auto subscribe = [&](v1::Layout layout) {
      v1::Subscribe s = Sub("sparse", 100);
      s.set_frame_mode(layout == v1::LAYOUT_DENSE);  // dense in frame mode, CSR in sequence mode
      if (shm) s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
      if (layout != v1::LAYOUT_NATIVE) (*s.mutable_layouts())["words"] = layout;
      auto sub = (*client)->Subscribe(s);
      EXPECT_TRUE(sub.ok()) << sub.status();
      return std::move(*sub);
    };
    for (v1::Layout layout : {v1::LAYOUT_CSR, v1::LAYOUT_DENSE}) {
      auto native = subscribe(v1::LAYOUT_NATIVE);
      auto converted = subscribe(layout);
      ReceivedBatch a, b;
      uint64_t batches = 0;
      while (true) {
        auto more_a = native->Next(&a);
        auto more_b = converted->Next(&b);
        ASSERT_TRUE(more_a.ok() && more_b.ok()) << more_a.status() << more_b.status();
        ASSERT_EQ(*more_a, *more_b);
        if (!*more_a) break;
        ++batches;
        auto csc = a.Csc<float>(0);
        ASSERT_TRUE(csc.ok()) << csc.status();
        EXPECT_FALSE(b.Csc<float>(0).ok());  // delivered in the asked layout only
        Columns got;
        if (layout == v1::LAYOUT_CSR) {
          auto csr = b.Csr<float>(0);
          ASSERT_TRUE(csr.ok()) << csr.status();
          EXPECT_EQ(csr->nnz, csc->nnz);
          got = FromCsr(*csr);
        } else {
          auto dense = b.Dense<float>(0);
          ASSERT_TRUE(dense.ok()) << dense.status();
          EXPECT_EQ(dense->dim, 5000u);
          got = FromDense(*dense);
        }
        EXPECT_EQ(got, layout == v1::LAYOUT_DENSE ? WithoutZeros(FromCsc(*csc)) : FromCsc(*csc)) << "batch " << batches;
        auto la = a.Dense<float>(1), lb = b.Dense<float>(1);
        ASSERT_TRUE(la.ok() && lb.ok());
        ASSERT_EQ(la->rows * la->steps, lb->rows * lb->steps);
        EXPECT_EQ(0, std::memcmp(la->data, lb->data, la->rows * la->steps * sizeof(float)));
      }
      EXPECT_EQ(batches, 20u);
    }
  }
  StreamRequest csr;
  csr.layouts["words"] = OutputLayout::kCsr;
  const std::string expected = LocalDump("sparse", 128, csr);
  auto client = Client::Connect(d.tcp());
  v1::Subscribe s = Sub("sparse", 128);
  (*s.mutable_layouts())["words"] = v1::LAYOUT_CSR;
  auto sub = (*client)->Subscribe(s);
  auto got = Drain(sub->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
  EXPECT_EQ(Keys(expected).size(), 2000u);
}

// One parser thread for the whole daemon: eight subscribers (different seeds, so different
// chunks) all complete and each gets exactly its local dump.
TEST(Service, SubscribersShareABoundedParserPool) {
  ServiceOptions o;
  o.parser_threads = 1;
  o.parser_threads_per_stream = 2;
  Daemon d(o);
  std::vector<std::string> outs(8);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto client = Client::Connect(i % 2 ? d.tcp() : d.unix_socket());
      auto sub = (*client)->Subscribe(Sub("sparse", 64, true, i));
      auto got = Drain(sub->get());
      outs[i] = got.ok() ? *got : got.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t i = 0; i < 8; ++i) {
    StreamRequest r;
    r.seed = i;
    EXPECT_EQ(outs[i], LocalDump("sparse", 64, r)) << "subscriber " << i;
  }
}

TEST(Service, RefusesMalformedRequests) {
  Daemon d;
  v1::StreamRequest ack;
  ack.mutable_ack()->set_serial(0);
  EXPECT_EQ(RawStream(d.tcp(), {ack}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto code = [&](v1::Subscribe s) { return RawStream(d.tcp(), {SubscribeRequest(s)}); };
  EXPECT_EQ(code(Sub("sparse", 0)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(Sub("sparse", 1u << 30)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(Sub("nope", 10)).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(Sub(std::string(300, 'x'), 10)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Subscribe credits = Sub("sparse", 10);
  credits.set_initial_credits(1000);
  EXPECT_EQ(code(credits).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Subscribe rank = Sub("sparse", 10);
  rank.set_rank(5);
  rank.set_world(2);
  EXPECT_EQ(code(rank).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Subscribe layout = Sub("sparse", 10);
  (*layout.mutable_layouts())["nope"] = v1::LAYOUT_CSC;
  EXPECT_EQ(code(layout).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Subscribe dense_as_csr = Sub("sparse", 10);
  (*dense_as_csr.mutable_layouts())["label"] = v1::LAYOUT_CSR;
  grpc::Status refused = code(dense_as_csr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "stream 'label' is dense: layout csr applies to sparse streams only");
  v1::Subscribe unknown_layout = Sub("sparse", 10);
  (*unknown_layout.mutable_layouts())["words"] = static_cast<v1::Layout>(77);
  EXPECT_EQ(code(unknown_layout).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Subscribe cursor = Sub("sparse", 10);
  cursor.set_resume_cursor("cv1.garbage");
  grpc::Status bad_cursor = code(cursor);
  EXPECT_EQ(bad_cursor.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_cursor.error_message().find("cursor is not valid"), std::string::npos);
  v1::Subscribe huge = Sub("sparse", 10);
  huge.set_resume_cursor(std::string(2 << 20, 'a'));  // over the transport's limit
  EXPECT_EQ(code(huge).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // An ack for a batch never sent.
  v1::StreamRequest bogus;
  bogus.mutable_ack()->set_serial(12345);
  EXPECT_EQ(RawStream(d.tcp(), {SubscribeRequest(Sub("sparse", 10)), bogus}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// The daemon parses the Stream's requests itself (the method is raw): bytes that are not a
// StreamRequest end the call with INVALID_ARGUMENT, before or after the subscribe.
TEST(Service, ARequestThatDoesNotParseIsInvalidArgument) {
  Daemon d;
  auto channel = grpc::CreateChannel(d.tcp(), grpc::InsecureChannelCredentials());
  auto status = [&](bool subscribe_first) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    static const grpc::internal::RpcMethod kStream("/conveyor.v1.Loader/Stream",
                                                   grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), kStream,
                                                                                               &ctx));
    if (subscribe_first) {
      grpc::ByteBuffer first;
      bool own = false;
      EXPECT_TRUE(grpc::SerializationTraits<v1::StreamRequest>::Serialize(SubscribeRequest(Sub("sparse", 10)), &first,
                                                                          &own)
                      .ok());
      stream->Write(first);
    }
    const char garbage[] = {0x0a, 0x7f};  // a subscribe longer than the message
    grpc::Slice slice(garbage, sizeof(garbage));
    stream->Write(grpc::ByteBuffer(&slice, 1));
    grpc::ByteBuffer ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  };
  for (bool subscribe_first : {false, true}) {
    grpc::Status st = status(subscribe_first);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << subscribe_first;
    EXPECT_EQ(st.error_message(), "a message that does not parse as a StreamRequest") << subscribe_first;
  }
}

// Stream calls that never send their subscribe message would hold the subscription slots
// for as long as their peer keeps the connection (a hostile peer's: 256 silent calls and no
// trainer gets in). Each ends with DEADLINE_EXCEEDED after the subscribe timeout, and the
// slots are free again.
TEST(Service, CallsThatNeverSubscribeEndAfterTheSubscribeTimeout) {
  ServiceOptions o;
  o.max_subscriptions = 4;
  o.subscribe_timeout_ms = 300;
  Daemon d(o);
  auto channel = grpc::CreateChannel(d.tcp(), grpc::InsecureChannelCredentials());
  auto stub = v1::Loader::NewStub(channel);
  struct Silent {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamResponse>> stream;
  };
  std::vector<std::unique_ptr<Silent>> silent;
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) {
    auto c = std::make_unique<Silent>();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->stream = stub->Stream(&c->ctx);
    silent.push_back(std::move(c));
  }
  ASSERT_TRUE(WaitFor(5, [&] { return d.service().active_streams() == 4; }));
  // Every slot held: a fifth call is refused at once, saying which limit and how to raise it.
  const grpc::Status fifth = RawStream(d.tcp(), {SubscribeRequest(Sub("simple", 4))});
  EXPECT_EQ(fifth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(fifth.error_message().find("more than 4 subscriptions at once"), std::string::npos) << fifth.error_message();
  EXPECT_NE(fifth.error_message().find("--max-subscriptions"), std::string::npos) << fifth.error_message();
  for (auto& c : silent) {
    v1::StreamResponse ignored;
    EXPECT_FALSE(c->stream->Read(&ignored));
    const grpc::Status st = c->stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
    EXPECT_EQ(st.error_message(), "no subscribe message within 0.3 s of the call's start (conveyord --subscribe-timeout)");
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 10.0);
  ASSERT_TRUE(WaitFor(5, [&] { return d.service().active_streams() == 0; }));
  // A subscriber that does subscribe in time is served to its end.
  auto client = Client::Connect(d.tcp());
  ASSERT_TRUE(client.ok()) << client.status();
  auto sub = (*client)->Subscribe(Sub("simple", 4));
  ASSERT_TRUE(sub.ok()) << sub.status();
  auto got = Drain(sub->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, LocalDump("simple", 4));
}

// One connection holds at most kMaxStreamsPerConnection calls at once (HTTP/2's
// SETTINGS_MAX_CONCURRENT_STREAMS): the calls past it wait in the client, not in the daemon.
TEST(Service, OneConnectionOpensAtMostItsShareOfCalls) {
  ServiceOptions o;
  o.max_subscriptions = 1000;
  Daemon d(o);
  auto channel = grpc::CreateChannel(d.tcp(), grpc::InsecureChannelCredentials());
  auto stub = v1::Loader::NewStub(channel);
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::StreamRequest, v1::StreamResponse>> stream;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kMaxStreamsPerConnection + 20; ++i) {
    auto c = std::make_unique<Call>();
    c->stream = stub->AsyncStream(&c->ctx, &cq, c.get());
    calls.push_back(std::move(c));
  }
  ASSERT_TRUE(WaitFor(10, [&] { return d.service().active_streams() >= static_cast<size_t>(kMaxStreamsPerConnection); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(d.service().active_streams(), static_cast<size_t>(kMaxStreamsPerConnection));
  for (auto& c : calls) c->ctx.TryCancel();
  void* tag;
  bool ok;
  for (size_t i = 0; i < calls.size(); ++i) ASSERT_TRUE(cq.Next(&tag, &ok));  // each call's start
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  EXPECT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
}

// The unary calls take their requests raw: bytes that do not parse are INVALID_ARGUMENT
// saying so (gRPC's typed handlers answered UNIMPLEMENTED with no message), and a TCP caller
// without the token is UNAUTHENTICATED before anything is parsed.
TEST(Service, UnaryRequestsThatDoNotParseAreInvalidArgumentAfterTheTokenCheck) {
  ServiceOptions o;
  o.token = "s3cret";
  Daemon d(o);
  const char garbage[] = {0x0a, 0x7f};  // field 1, 127 bytes long, in a 2-byte message
  auto call = [&](const std::string& address, const char* method) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    const grpc::internal::RpcMethod rpc(method, grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer request(&slice, 1), response;
    return grpc::internal::BlockingUnaryCall(channel.get(), rpc, &ctx, request, &response);
  };
  for (const char* method : {"/conveyor.v1.Loader/ListDatasets", "/conveyor.v1.Loader/DescribeDataset"}) {
    const grpc::Status tcp = call(d.tcp(), method);
    EXPECT_EQ(tcp.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method << ": " << tcp.error_message();
    const grpc::Status unix_socket = call(d.unix_socket(), method);
    EXPECT_EQ(unix_socket.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(unix_socket.error_message(),
              std::string("a message that does not parse as a conveyor.v1.") +
                  (std::string(method).find("List") != std::string::npos ? "ListDatasetsRequest" : "DescribeDatasetRequest"));
  }
}

TEST(Service, ResumeFromACursorContinuesExactly) {
  Daemon d;
  auto client = Client::Connect(d.tcp());
  const std::string full = LocalDump("sparse", 64);
  auto sub = (*client)->Subscribe(Sub("sparse", 64));
  auto head = Drain(sub->get(), 7);
  ASSERT_TRUE(head.ok());
  const std::string cursor = (*sub)->last_cursor();
  (*sub)->Cancel();
  v1::Subscribe s = Sub("sparse", 64);
  s.set_resume_cursor(cursor);
  auto rest_sub = (*client)->Subscribe(s);
  auto rest = Drain(rest_sub->get());
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(*head + *rest, full);
}

// Takes one batch, drains the daemon, and reads the rest (appending every batch's dump to
// `dump` when given): the stream must end UNAVAILABLE naming the last cursor delivered.
void ExpectDrainEndsWithTheLastCursor(Daemon* d, Subscription* sub, std::string* dump) {
  ReceivedBatch b;
  auto first = sub->Next(&b);
  ASSERT_TRUE(first.ok() && *first) << first.status();
  if (dump) AppendDump(b.descriptor().epoch(), b.descriptor().batch(), b.plan(), b.bytes(), b.cursor(), dump);
  d->service().Drain();
  absl::Status end;
  while (true) {
    auto more = sub->Next(&b);
    if (!more.ok()) {
      end = more.status();
      break;
    }
    ASSERT_TRUE(*more);
    if (dump) AppendDump(b.descriptor().epoch(), b.descriptor().batch(), b.plan(), b.bytes(), b.cursor(), dump);
  }
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(end.message().find("resume with cursor " + sub->last_cursor()), std::string::npos) << end;
}

// The daemon's pipelined path (CUDA streams take it on a GPU host; here the CPU assembler
// on a worker thread): two batches in flight, published in order, over inline parts,
// shared-memory slots with 1 to 3 credits and truncated BPTT, each equal to the dump; and a
// drain with batches in flight ends with the last cursor sent, from which the rest follows.
TEST(Service, PipelinedAssemblyDeliversWhatDumpPrints) {
  ServiceOptions o;
  o.pipelined_cpu_assembly = true;
  o.inline_part_bytes = 4096;
  o.min_slot_bytes = 256;
  o.slot_headroom = 1.0;  // new segments announced while a batch is in flight
  Daemon d(o);
  auto client = Client::Connect(d.unix_socket());
  const std::string sparse = LocalDump("sparse", 40);
  auto inl = (*client)->Subscribe(Sub("sparse", 40));
  auto got = Drain(inl->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, sparse);
  for (uint32_t credits : {1, 2, 3}) {
    v1::Subscribe s = Sub("sparse", 40);
    s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
    s.set_initial_credits(credits);
    auto sub = (*client)->Subscribe(s);
    auto shm = Drain(sub->get());
    ASSERT_TRUE(shm.ok()) << shm.status();
    EXPECT_EQ(*shm, sparse) << credits << " credits";
  }
  ExpectTruncatedStreamMatchesDump(client->get());
}

TEST(Service, PipelinedDrainResumesExactly) {
  ServiceOptions o;
  o.pipelined_cpu_assembly = true;
  auto d = std::make_unique<Daemon>(o);
  auto client = Client::Connect(d->tcp());
  v1::Subscribe s = Sub("sparse", 10);
  s.set_epochs(3);
  s.set_initial_credits(8);
  SubscribeOptions no_reconnect;
  no_reconnect.reconnect = false;
  auto sub = (*client)->Subscribe(s, no_reconnect);
  std::string head;
  ExpectDrainEndsWithTheLastCursor(d.get(), sub->get(), &head);
  const std::string cursor = (*sub)->last_cursor();
  sub->reset();
  d.reset();
  Daemon again(o);
  auto client2 = Client::Connect(again.tcp());
  v1::Subscribe r = s;
  r.set_resume_cursor(cursor);
  auto rest_sub = (*client2)->Subscribe(r);
  auto rest = Drain(rest_sub->get());
  ASSERT_TRUE(rest.ok()) << rest.status();
  StreamRequest extra;
  extra.epochs = 3;
  auto config = LoadConfigFile(kExamples);
  ReadOptions ro;
  ro.minibatch_size = 10;
  ro.epochs = 3;
  ro.cursors = true;
  ro.request.randomize = true;
  ro.request.seed = 3;
  EXPECT_EQ(head + *rest, *DumpDataset(*config->Find("sparse"), ro));
}

TEST(Service, DrainEndsStreamsWithTheirLastCursor) {
  auto d = std::make_unique<Daemon>();
  auto client = Client::Connect(d->tcp());
  v1::Subscribe s = Sub("sparse", 10);
  s.set_epochs(100);
  SubscribeOptions no_reconnect;
  no_reconnect.reconnect = false;
  auto sub = (*client)->Subscribe(s, no_reconnect);
  ExpectDrainEndsWithTheLastCursor(d.get(), sub->get(), nullptr);
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

TEST(Service, AClientThatGoesAwayReleasesItsSubscription) {
  Daemon d;
  {
    auto client = Client::Connect(d.tcp());
    v1::Subscribe s = Sub("sparse", 10);
    s.set_epochs(1000);
    auto sub = (*client)->Subscribe(s);
    ReceivedBatch b;
    ASSERT_TRUE(*(*sub)->Next(&b));
    EXPECT_EQ(d.service().active_streams(), 1u);
  }  // the client and its subscription are gone, mid-stream
  for (int i = 0; i < 100 && d.service().active_streams() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(d.service().active_streams(), 0u);
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// Entries of /dev/shm that could be conveyor's (named for it): other processes of the machine
// (torch, Python's multiprocessing in tests running beside this one) come and go there.
std::set<std::string> DevShm() {
  std::set<std::string> names;
  FILE* p = ::popen("ls /dev/shm 2>/dev/null", "r");
  char buf[512];
  while (p && std::fgets(buf, sizeof(buf), p)) {
    if (std::strstr(buf, "conveyor") != nullptr) names.insert(buf);
  }
  if (p) ::pclose(p);
  return names;
}

// CUDA IPC: without a device on the daemon's host the subscription is refused with what
// to use instead; an unknown transport is refused too. (With a device, the daemon's blocks
// cannot be opened by its own process: the cross-process test is CudaIpcGpu in the GPU
// binary, and RESULTS.md has the command for a real subscriber.)
TEST(CudaIpc, WithoutADeviceTheSubscriptionIsRefusedWithTheAlternatives) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "this host has a CUDA device: the refusal does not apply";
  Daemon d;
  auto client = Client::Connect(d.unix_socket());
  v1::Subscribe s = Sub("sparse", 64);
  s.set_transport(v1::TRANSPORT_CUDA_IPC);
  auto sub = (*client)->Subscribe(s);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ReceivedBatch b;
  auto more = (*sub)->Next(&b);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kFailedPrecondition) << more.status();
  EXPECT_NE(more.status().message().find("TRANSPORT_CUDA_IPC needs a CUDA device on the daemon's host"), std::string::npos)
      << more.status();
  EXPECT_NE(more.status().message().find("TRANSPORT_SHARED_MEMORY"), std::string::npos);
  v1::Subscribe unknown = Sub("sparse", 64);
  unknown.set_transport(static_cast<v1::Transport>(9));
  EXPECT_EQ(RawStream(d.tcp(), {SubscribeRequest(unknown)}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(SharedMemory, DeliversTheSameBytesAsInline) {
  const auto before = DevShm();
  Daemon d;
  auto client = Client::Connect(d.unix_socket());
  for (const char* dataset : {"sparse", "sequences"}) {
    v1::Subscribe s = Sub(dataset, 64);
    s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
    s.set_initial_credits(3);
    auto sub = (*client)->Subscribe(s);
    auto got = Drain(sub->get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, LocalDump(dataset, 64)) << dataset;
  }
  EXPECT_EQ(DevShm(), before);  // memfd segments have no name: nothing to leave behind
}

// A stream that ends right after its batches: the daemon keeps the call, and the segments its
// batches lie in, until the client closes its side, so a client that fetches a segment's
// descriptor only after the end arrived still gets it (the daemon used to finish at once and
// free the segment: "the daemon sent no segment descriptor", seen under load).
TEST(SharedMemory, SegmentsOutliveTheEndUntilTheClientClosesItsSide) {
  Daemon d;
  auto stub = v1::Loader::NewStub(grpc::CreateChannel(d.unix_socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  v1::Subscribe s = Sub("simple", 1000);  // one batch
  s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
  ASSERT_TRUE(stream->Write(SubscribeRequest(s)));
  std::vector<v1::SharedMemorySegment> segments;
  v1::StreamResponse m;
  while (stream->Read(&m) && !m.has_end()) {
    if (m.has_segment()) segments.push_back(m.segment());
  }
  ASSERT_TRUE(m.has_end());
  ASSERT_EQ(segments.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a slow client
  auto mapped = MapSharedSegment(segments[0]);
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&m));  // the daemon ends the call once the client closed its side
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(SharedMemory, BatchesLargerThanTheFirstGetANewSegment) {
  ServiceOptions o;
  o.min_slot_bytes = 256;
  o.slot_headroom = 1.0;
  Daemon d(o);
  auto client = Client::Connect(d.unix_socket());
  // Batches of 40 documents of 5 to 30 words: some outgrow the first segment's slots.
  v1::Subscribe s = Sub("sparse", 40);
  s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
  s.set_epochs(3);
  auto sub = (*client)->Subscribe(s);
  auto got = Drain(sub->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT((*sub)->shared_segments(), 1u);
  EXPECT_EQ(*got, [] {
    StreamRequest r;
    r.epochs = 3;
    auto config = LoadConfigFile(kExamples);
    ReadOptions ro;
    ro.minibatch_size = 40;
    ro.epochs = 3;
    ro.cursors = true;
    ro.request.randomize = true;
    ro.request.seed = 3;
    return *DumpDataset(*config->Find("sparse"), ro);
  }());
}

TEST(SharedMemory, ACrashedClientLeavesNothingBehind) {
  const auto before = DevShm();
  Daemon d;
  {
    auto client = Client::Connect(d.unix_socket());
    v1::Subscribe s = Sub("sparse", 10);
    s.set_transport(v1::TRANSPORT_SHARED_MEMORY);
    s.set_epochs(1000);
    auto sub = (*client)->Subscribe(s);
    ReceivedBatch b;
    ASSERT_TRUE(*(*sub)->Next(&b));
  }
  for (int i = 0; i < 100 && d.service().active_streams() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(d.service().active_streams(), 0u);
  EXPECT_EQ(DevShm(), before);
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// A Prometheus endpoint of its own, and the options that make a daemon report to it.
class MetricsEndpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = metrics_.Serve("127.0.0.1:0");
    ASSERT_GT(port_, 0);
    options_.metrics = &metrics_;
  }
  std::string Page() const { return HttpGet(port_, "/metrics"); }
  // The chunk cache holds nothing of `dataset`, and its gauges say so (they are set by each
  // batch, and once more when a stream ends).
  static void ExpectNoChunkHeld(const std::string& page, const std::string& dataset) {
    for (const char* gauge : {"conveyor_chunk_cache_chunks", "conveyor_chunk_cache_bytes"}) {
      EXPECT_NE(page.find(std::string(gauge) + "{dataset=\"" + dataset + "\"} 0\n"), std::string::npos) << gauge << "\n" << page;
    }
  }

  Metrics metrics_;
  int port_ = 0;
  ServiceOptions options_;
};

TEST_F(MetricsEndpoint, CountWhatWasServed) {
  {
    Daemon d(options_);
    auto client = Client::Connect(d.tcp());
    auto sub = (*client)->Subscribe(Sub("sparse", 250));
    auto got = Drain(sub->get());
    ASSERT_TRUE(got.ok());
  }
  const std::string page = Page();
  EXPECT_NE(page.find("conveyor_batches_served_total{dataset=\"sparse\",transport=\"inline\"} 8"), std::string::npos) << page;
  EXPECT_NE(page.find("conveyor_samples_served_total{dataset=\"sparse\",transport=\"inline\"} 2000"), std::string::npos);
  EXPECT_NE(page.find("conveyor_active_streams 0"), std::string::npos);
  EXPECT_NE(page.find("conveyor_batches_in_flight 0"), std::string::npos);
  EXPECT_NE(page.find("conveyor_streams_ended_total{code=\"0\"} 1"), std::string::npos);
  EXPECT_NE(page.find("conveyor_parse_seconds_total{dataset=\"sparse\"}"), std::string::npos);
  ExpectNoChunkHeld(page, "sparse");  // the stream is over: nothing is kept for readers to come
  EXPECT_NE(page.find("conveyor_parse_jobs_queued 0"), std::string::npos);
}

// A stream cancelled mid-epoch held parsed chunks at its last batch: once no stream is left,
// the chunk cache holds none, and its gauges say so (they stayed at the last batch's value
// until the next stream).
TEST_F(MetricsEndpoint, NoChunkIsKeptAfterTheLastStreamIsCancelled) {
  Daemon d(options_);
  {
    auto client = Client::Connect(d.tcp());
    v1::Subscribe s = Sub("sparse", 50);
    s.set_epochs(1000);  // far from its end when cancelled
    auto sub = (*client)->Subscribe(s);
    ASSERT_TRUE(sub.ok());
    ASSERT_TRUE(Drain(sub->get(), 3).ok());
  }  // the subscription goes: its stream is cancelled
  ASSERT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
  ExpectNoChunkHeld(Page(), "sparse");
}

// keepDataInMemory in the daemon: a dataset's parsed chunks stay for the subscriptions to
// come (the next one delivers the same bytes and parses nothing), while a dataset without it
// parses anew and holds nothing once its last stream is over. (A DataLoader's workers
// subscribe anew every epoch: each epoch parsed the whole dataset again.)
// Datasets `kept` (keepDataInMemory) and `plain` of the same file (examples/sparse.ctf, in
// chunks of 64 KiB), written into `dir`; returns the configuration's path.
std::string KeptAndPlain(const TempDir& dir) {
  std::string yaml = "datasets:\n";
  for (const std::string name : {"kept", "plain"}) {
    yaml += "  " + name + ":\n    randomize: false\n" + (name == "kept" ? "    keepDataInMemory: true\n" : "") +
            "    deserializers:\n      - type: CNTKTextFormat\n        file: " + CONVEYOR_SOURCE_DIR +
            "/examples/sparse.ctf\n        chunkSizeInBytes: 65536\n        input:\n"
            "          x: {dim: 5000, format: sparse}\n          y: {dim: 1, format: dense}\n";
  }
  return dir.Write("keep.yaml", yaml);
}

// The value of `metric`{dataset="`dataset`"} on a metrics page (0 when absent).
double DatasetMetric(const std::string& page, const std::string& metric, const std::string& dataset) {
  const std::string line = metric + "{dataset=\"" + dataset + "\"} ";
  const size_t at = page.find(line);
  return at == std::string::npos ? 0.0 : std::stod(page.substr(at + line.size()));
}

// A whole subscription to `dataset` (minibatches of 100), in the dump format ("" on error).
std::string ReadAll(const Daemon& d, const std::string& dataset) {
  auto client = Client::Connect(d.tcp());
  EXPECT_TRUE(client.ok());
  if (!client.ok()) return "";
  auto sub = (*client)->Subscribe(Sub(dataset, 100));
  EXPECT_TRUE(sub.ok()) << sub.status();
  if (!sub.ok()) return "";
  auto got = Drain(sub->get());
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : "";
}

TEST_F(MetricsEndpoint, KeepDataInMemoryParsesOncePerDaemon) {
  TempDir dir;
  Daemon d(options_, KeptAndPlain(dir));
  // The counter conveyor_chunks_parsed_total of `dataset` (0 before its first parse).
  auto parses = [&](const std::string& dataset) { return DatasetMetric(Page(), "conveyor_chunks_parsed_total", dataset); };
  auto read = [&](const std::string& dataset) -> std::string {
    auto client = Client::Connect(d.tcp());
    EXPECT_TRUE(client.ok());
    if (!client.ok()) return "";
    auto sub = (*client)->Subscribe(Sub(dataset, 100));
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) return "";
    auto got = Drain(sub->get());
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : "";
  };
  const std::string kept = read("kept");
  ASSERT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
  const double kept_parses = parses("kept");
  EXPECT_GE(kept_parses, 4) << "the file is 256 KB in chunks of 64 KB";
  const std::string page = Page();
  EXPECT_EQ(page.find("conveyor_chunk_cache_chunks{dataset=\"kept\"} 0\n"), std::string::npos)
      << "no stream is left, and the chunks of a keepDataInMemory dataset are still held\n" << page;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(read("kept"), kept);
    EXPECT_EQ(parses("kept"), kept_parses) << "subscription " << i + 2 << " parsed again";
  }

  const std::string plain = read("plain");
  EXPECT_EQ(plain, kept);
  ASSERT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
  const double plain_parses = parses("plain");
  EXPECT_EQ(plain_parses, kept_parses);
  ExpectNoChunkHeld(Page(), "plain");
  EXPECT_EQ(read("plain"), plain);
  EXPECT_EQ(parses("plain"), 2 * plain_parses) << "without keepDataInMemory, a new subscription parses again";
}

// Chunks kept for subscriptions to come count against chunkCacheBytes, and give way when a
// parse needs the room: with a budget of 1.5x the kept dataset, a whole read of another
// dataset of the same size succeeds (it would be refused RESOURCE_EXHAUSTED if they did not),
// and the kept dataset is parsed again in part afterwards, with the same bytes.
// The parsed size of dataset `kept` of KeptAndPlain() (the chunk cache's gauge after a whole
// read), and that read in the dump format; from a daemon of its own with metrics of its own.
double KeptBytes(const std::string& config, std::string* dump) {
  Metrics metrics;
  const int port = metrics.Serve("127.0.0.1:0");
  ServiceOptions o;
  o.metrics = &metrics;
  Daemon d(o, config);
  *dump = ReadAll(d, "kept");
  EXPECT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
  return DatasetMetric(HttpGet(port, "/metrics"), "conveyor_chunk_cache_bytes", "kept");
}

// A daemon over KeptAndPlain() whose chunk cache holds `budget` times the parsed dataset
// `kept` (reported on `page`), after one whole read of `kept`: that read (the same as a
// daemon without a budget delivers) and the parses it made.
struct KeptDaemon {
  std::unique_ptr<Daemon> daemon;
  std::string expected;
  double kept_bytes = 0, parses = 0;
};

KeptDaemon StartKeptDaemon(const std::function<std::string()>& page, const ServiceOptions& options,
                           const std::string& config, double budget) {
  KeptDaemon k;
  k.kept_bytes = KeptBytes(config, &k.expected);
  EXPECT_GT(k.kept_bytes, 0);
  ServiceOptions o = options;
  o.chunk_cache_bytes = static_cast<uint64_t>(k.kept_bytes * budget);
  k.daemon = std::make_unique<Daemon>(o, config);
  EXPECT_TRUE(ReadAll(*k.daemon, "kept") == k.expected) << "not the same batches";
  EXPECT_TRUE(WaitFor(10, [&] { return k.daemon->service().active_streams() == 0; }));
  k.parses = DatasetMetric(page(), "conveyor_chunks_parsed_total", "kept");
  EXPECT_GT(k.parses, 0);
  return k;
}

TEST_F(MetricsEndpoint, KeptChunksGiveWayWhenTheChunkCacheNeedsTheRoom) {
  TempDir dir;
  KeptDaemon k = StartKeptDaemon([this] { return Page(); }, options_, KeptAndPlain(dir), 1.5);
  Daemon& d = *k.daemon;
  EXPECT_TRUE(ReadAll(d, "plain") == k.expected) << "a parse of `plain` was refused: the kept chunks did not give way";
  ASSERT_TRUE(WaitFor(10, [&] { return d.service().active_streams() == 0; }));
  EXPECT_LT(DatasetMetric(Page(), "conveyor_chunk_cache_bytes", "kept"), k.kept_bytes);
  EXPECT_TRUE(ReadAll(d, "kept") == k.expected) << "not the same batches";
  EXPECT_GT(DatasetMetric(Page(), "conveyor_chunks_parsed_total", "kept"), k.parses);
}

// A kept dataset that fits the budget with little to spare is not parsed again by the next
// subscription: its chunks in memory are not charged again when read (they were, and each
// charge dropped the least recently used kept chunk, the next one to be read).
TEST_F(MetricsEndpoint, AKeptDatasetThatJustFitsIsNotParsedAgain) {
  TempDir dir;
  KeptDaemon k = StartKeptDaemon([this] { return Page(); }, options_, KeptAndPlain(dir), 1.02);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(ReadAll(*k.daemon, "kept") == k.expected) << "not the same batches";
    EXPECT_EQ(DatasetMetric(Page(), "conveyor_chunks_parsed_total", "kept"), k.parses) << "subscription " << i + 2;
  }
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// A daemon with TLS (a self-signed certificate made here by openssl) and a bearer token on
// TCP, and a plain unix socket.
class SecureDaemon {
 public:
  SecureDaemon() {
    const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=conveyor-test "
                            "-addext subjectAltName=DNS:conveyor-test -keyout " + dir_.path() + "/key.pem -out " +
                            dir_.path() + "/cert.pem >/dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
    if (!ok_) return;
    cert_ = ReadFile(dir_.path() + "/cert.pem");
    auto config = LoadConfigFile(kExamples);
    auto registry = DatasetRegistry::Open(*config, 2);
    ServiceOptions o;
    o.token = "s3cret";
    service_ = std::make_unique<LoaderService>(std::move(*registry), o);
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({ReadFile(dir_.path() + "/key.pem"), cert_});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    b.AddListeningPort("unix:" + dir_.path() + "/s.sock", grpc::InsecureServerCredentials());
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
  }
  ~SecureDaemon() {
    if (!server_) return;
    service_->Drain();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  bool ok() const { return ok_ && server_ != nullptr; }
  std::string tcp() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string unix_socket() const { return "unix:" + dir_.path() + "/s.sock"; }
  const std::string& cert() const { return cert_; }

 private:
  TempDir dir_;
  bool ok_ = false;
  std::string cert_;
  std::unique_ptr<LoaderService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST(Security, TlsAndTokenAreRequiredOnTcpOnly) {
  SecureDaemon d;
  if (!d.ok()) GTEST_SKIP() << "openssl could not make a test certificate";
  ClientOptions good;
  good.tls_root_certs = d.cert();
  good.tls_server_name = "conveyor-test";
  good.token = "s3cret";
  auto ok = Client::Connect(d.tcp(), good);
  auto names = (*ok)->ListDatasets();
  ASSERT_TRUE(names.ok()) << names.status();
  auto sub = (*ok)->Subscribe(Sub("simple", 500));
  auto got = Drain(sub->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), LocalDump("simple", 500).size());

  ClientOptions wrong = good;
  wrong.token = "guess";
  EXPECT_EQ((*Client::Connect(d.tcp(), wrong))->ListDatasets().status().code(), absl::StatusCode::kUnauthenticated);
  ClientOptions none = good;
  none.token.clear();
  EXPECT_EQ((*Client::Connect(d.tcp(), none))->ListDatasets().status().code(), absl::StatusCode::kUnauthenticated);
  auto refused = (*Client::Connect(d.tcp(), none))->Subscribe(Sub("simple", 500));
  ReceivedBatch b;
  EXPECT_EQ((*refused)->Next(&b).status().code(), absl::StatusCode::kUnauthenticated);
  // Plaintext to a TLS port does not get through.
  EXPECT_FALSE((*Client::Connect(d.tcp()))->ListDatasets().ok());
  // The unix socket is guarded by its permissions: no token needed.
  EXPECT_TRUE((*Client::Connect(d.unix_socket()))->ListDatasets().ok());
}

}  // namespace
}  // namespace conveyor::testing
