// conveyor_client.h: the C++ client of conveyord. Connect to a daemon (TCP "host:port" or
// "unix:/path"), list and describe its datasets, and subscribe to a stream of minibatches:
//
//   auto client = conveyor::Client::Connect("127.0.0.1:7070");
//   v1::Subscribe s;  s.set_dataset("train");  s.set_minibatch_size(256);
//   auto sub = (*client)->Subscribe(s);
//   conveyor::ReceivedBatch b;
//   while (*(*sub)->Next(&b)) { auto x = b.Dense<float>(0); ... save b.cursor() ... }
//
// Batches arrive as bytes laid out per docs/design.md section 7; typed views index them without
// copying. The daemon is treated as untrusted (proto/stream_reader.h): sizes are bounded by
// the client's limits, serials, parts, arrays, shapes and pieces are checked, and every batch
// is checked before it is handed out (arrays inside the bytes, CSC pointers monotonic and
// within nnz, row indices within dim), so a bad server cannot make a client read out of
// bounds, hang or end silently: a malformed stream is an error, and the call is cancelled
// before it is finished. Shared-memory segments must be sealed against shrinking.
// Keepalive pings notice a frozen or vanished daemon within seconds, and a read that waits
// longer than the idle deadline is cancelled. A Subscription acknowledges a batch when the
// next one is asked for (the credit goes back to the daemon); with reconnect on, a broken
// stream (UNAVAILABLE: a daemon gone, draining, frozen or idle) is resumed from the last
// cursor received on the next daemon, so the batches handed out stay exactly the stream's.
// Not thread-safe: one thread per Subscription.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/idle_watchdog.h"
#include "client/cpp/shared_segment.h"
#include "common/batch/batch_plan.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "proto/stream_reader.h"

namespace conveyor {

class SlicePart;  // proto/inline_wire.h

template <typename T>
struct DenseView {
  const T* data = nullptr;  // [rows][T][dim] (or [rows][dim] in frame mode)
  uint64_t rows = 0, steps = 1, dim = 0;
  const int32_t* lengths = nullptr;  // [rows], or nullptr in frame mode
  const T* at(uint64_t row, uint64_t t) const { return data + (row * steps + t) * dim; }
};

// An ids stream (int32 labels, one a sample).
struct IdsView {
  const int32_t* data = nullptr;  // [rows][T] (or [rows] in frame mode)
  uint64_t rows = 0, steps = 1;
  const int32_t* lengths = nullptr;  // [rows], or nullptr in frame mode
  const int32_t* at(uint64_t row) const { return data + row * steps; }
};

template <typename T>
struct CscView {
  const void* colptr = nullptr;  // int32 or int64, [columns + 1]
  bool colptr64 = false;
  const int32_t* rowind = nullptr;
  const T* values = nullptr;
  uint64_t columns = 0, nnz = 0, dim = 0, steps = 1;
  const int32_t* lengths = nullptr;
  int64_t begin(uint64_t col) const {
    return colptr64 ? static_cast<const int64_t*>(colptr)[col] : static_cast<const int32_t*>(colptr)[col];
  }
};

// A sparse stream delivered as CSR: the same dim x columns matrix stored by rows.
template <typename T>
struct CsrView {
  const void* rowptr = nullptr;  // int32 or int64, [dim + 1]
  bool rowptr64 = false;
  const int32_t* colind = nullptr;  // the column of each entry, ascending within a row
  const T* values = nullptr;
  uint64_t columns = 0, nnz = 0, dim = 0, steps = 1;
  const int32_t* lengths = nullptr;
  int64_t begin(uint64_t row) const {
    return rowptr64 ? static_cast<const int64_t*>(rowptr)[row] : static_cast<const int32_t*>(rowptr)[row];
  }
};

class ReceivedBatch {
 public:
  // The descriptor as received. Its pieces may be compact (Pieces.single_sample_rows: the
  // client asks for that form, keys only for batches of one-sample rows); plan().pieces
  // has every piece in full.
  const v1::BatchDescriptor& descriptor() const { return descriptor_; }
  const BatchPlan& plan() const { return plan_; }
  // The batch's bytes: owned (inline transport) or inside a shared-memory segment (valid
  // until the next Subscription::Next(), which acknowledges the batch and frees its slot).
  // TRANSPORT_CUDA_IPC: device memory on device(), in the daemon's slot, not readable by the
  // host; the typed views then hold device addresses. Call Next() only once the device work
  // reading the batch has completed (synchronize its stream or an event recorded after it):
  // Next() acknowledges the batch and the daemon assembles another into the slot.
  absl::Span<const std::byte> bytes() const { return {reinterpret_cast<const std::byte*>(data_), size_}; }
  bool on_device() const { return on_device_; }
  int device() const { return device_; }  // this process's CUDA ordinal; -1 for host batches
  const std::string& cursor() const { return descriptor_.cursor(); }
  uint64_t serial() const { return descriptor_.serial(); }
  // Index of the stream called `name`, or -1.
  int StreamIndex(const std::string& name) const;
  // Typed views; T must match the values: float or double (the batch's precision), or
  // uint16_t for a stream subscribed narrowed (dtypes: float16 or bfloat16; the values' bit
  // patterns, common/batch/half.h converts them). Dense() serves
  // dense streams and sparse streams subscribed as LAYOUT_DENSE; Csc() sparse streams in
  // their native layout; Csr() those subscribed as LAYOUT_CSR. Errors: InvalidArgument
  // for a wrong stream index, layout or element type.
  template <typename T>
  absl::StatusOr<DenseView<T>> Dense(size_t stream) const;
  template <typename T>
  absl::StatusOr<CscView<T>> Csc(size_t stream) const;
  template <typename T>
  absl::StatusOr<CsrView<T>> Csr(size_t stream) const;
  // An ids stream (`format: ids`). Errors: InvalidArgument for another kind of stream.
  absl::StatusOr<IdsView> Ids(size_t stream) const;

 private:
  friend class Subscription;
  v1::BatchDescriptor descriptor_;
  BatchPlan plan_;
  std::string bytes_;                     // inline transport
  std::shared_ptr<const void> mapping_;   // shared memory: keeps the segment mapped
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool on_device_ = false;
  int device_ = -1;
};

struct SubscribeOptions {
  // TRANSPORT_SHARED_MEMORY in the request: batches stay in the daemon's memfd segments (same
  // host only; the daemon's unix socket serves the descriptors).
  bool reconnect = true;  // resume from the last cursor when the stream breaks (UNAVAILABLE)
  int max_reconnects = 5;
  // A Next() that receives nothing from the daemon for this long cancels the call and treats
  // the stream as broken (UNAVAILABLE: resumed on the next daemon). 0: no deadline. Batches
  // the first parse of a large window makes wait that long at most.
  std::chrono::milliseconds idle_timeout{60000};
};

class Subscription {
 public:
  ~Subscription();
  // The next batch into `out` (acknowledging the one before it); false after the end of the
  // stream. Errors: the stream's status (NOT_FOUND, INVALID_ARGUMENT, DATA_LOSS, ...), or
  // UNAVAILABLE once reconnecting has failed.
  absl::StatusOr<bool> Next(ReceivedBatch* out);
  // The cursor of the last batch handed out (empty before the first).
  const std::string& last_cursor() const { return last_cursor_; }
  // Ends the call; the daemon releases everything the subscription held.
  void Cancel();
  // Inline parts received, and those of them that arrived in more than one gRPC slice
  // (which the one copy into the batch puts together).
  struct WireStats {
    uint64_t parts = 0, parts_in_pieces = 0;
  };
  const WireStats& wire_stats() const { return wire_stats_; }
  // Shared-memory segments mapped so far (CUDA IPC blocks opened so far).
  size_t shared_segments() const { return segments_.size(); }
  size_t cuda_segments() const { return device_segments_.size(); }
  // The daemon address the stream is on (it moves to the next one when a daemon fails).
  const std::string& address() const { return addresses_[current_]; }

 private:
  friend class Client;
  Subscription(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels,
               size_t first, v1::Subscribe request, SubscribeOptions options, std::string token, ClientLimits limits);
  absl::Status Open();
  absl::StatusOr<bool> Receive(ReceivedBatch* out);
  // A broken stream: cancels the call before finishing it (a daemon that keeps the call open
  // must not hang the client), and returns `why`.
  absl::Status Abort(absl::Status why);
  // Reads the next message, cancelling the call if none comes within `timeout` (0: none).
  enum class ReadResult { kMessage, kEnded, kIdle, kUnparsable };
  // *split: the message's inline part is in part_, not in `msg`.
  ReadResult Read(v1::StreamResponse* msg, bool* split, std::chrono::milliseconds timeout);
  // How long the call may stay open after the end of the stream (the daemon ends it at once).
  static constexpr std::chrono::milliseconds kEndGrace{2000};
  // Writes `request`; false when the write waited past the idle deadline (the call is then
  // cancelled). A write that fails otherwise shows up in the reads.
  bool Write(const v1::StreamRequest& request);
  absl::Status IdleError() const;

  const std::vector<std::string> addresses_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  size_t current_ = 0;
  v1::Subscribe request_;
  const SubscribeOptions options_;
  const std::string token_;
  const ClientLimits limits_;
  StreamReader reader_;
  std::unique_ptr<SlicePart> part_;  // the last message's inline part, in the slices it arrived in
  WireStats wire_stats_;
  IdleWatchdog watchdog_;
  std::unique_ptr<grpc::ClientContext> context_;
  // Raw bytes both ways: the client parses the daemon's messages itself, so that one that
  // does not parse is a protocol error it cancels the call for, not a stalled read.
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  bool has_unacked_ = false;
  uint64_t unacked_serial_ = 0;
  std::string last_cursor_;
  int reconnects_ = 0;
  bool ended_ = false;
  std::map<uint32_t, std::shared_ptr<MappedSegment>> segments_;  // shared memory, by segment id
  struct DeviceMapping;
  std::map<uint32_t, std::shared_ptr<DeviceMapping>> device_segments_;  // CUDA IPC, by segment id
  absl::Status OpenDeviceSegment(const v1::CudaIpcSegment& s);
};

struct ClientOptions {
  std::string tls_root_certs;  // PEM: use TLS and trust these roots (empty: plaintext)
  std::string tls_server_name; // override the name the certificate must carry (tests)
  std::string token;           // sent as "authorization: Bearer <token>" on every call
  ClientLimits limits;         // what the client accepts from a daemon (batch and segment sizes)
  // HTTP/2 keepalive: a ping every keepalive_time_ms; a daemon that does not answer within
  // keepalive_timeout_ms is gone (its calls end UNAVAILABLE, streams fail over). conveyord
  // accepts pings as often as every second.
  int keepalive_time_ms = 3000;
  int keepalive_timeout_ms = 3000;
};

class Client {
 public:
  // `address`: "host:port", "unix:/path", "dns:///name:port" (every address the name
  // resolves to), or several of these separated by commas: replicas serving the same
  // datasets. Calls go to the first that answers; a subscription whose daemon fails resumes
  // from its cursor on the next. Does not connect until the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                        const ClientOptions& options = {});
  absl::StatusOr<std::vector<std::string>> ListDatasets();
  absl::StatusOr<v1::DatasetDescription> Describe(const std::string& dataset);
  // Starts a stream. Errors from the daemon come from the first Next().
  absl::StatusOr<std::unique_ptr<Subscription>> Subscribe(const v1::Subscribe& request,
                                                          const SubscribeOptions& options = {});

 private:
  Client(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels, std::string token,
         ClientLimits limits);
  // Runs `call` on each daemon in turn, from the one that answered last, while they are
  // UNAVAILABLE.
  grpc::Status Unary(const std::function<grpc::Status(v1::Loader::Stub*, grpc::ClientContext*)>& call);
  const std::vector<std::string> addresses_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Loader::Stub>> stubs_;
  size_t current_ = 0;
  const std::string token_;
  const ClientLimits limits_;
};

// grpc::Status -> absl::Status: the code and the message unchanged. Declared here for the
// client's users (the installed header includes nothing of proto/ but stream_reader.h);
// defined once, in proto/status.cc, with its inverse the daemon uses.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace conveyor
