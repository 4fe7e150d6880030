#include "client/cpp/conveyor_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cuda/ipc.h"
#include "proto/inline_wire.h"
#include "proto/status.h"
#include "proto/wire.h"

namespace conveyor {

// ------------------------------------------------------------------ ReceivedBatch

int ReceivedBatch::StreamIndex(const std::string& name) const {
  for (size_t i = 0; i < plan_.streams.size(); ++i)
    if (plan_.streams[i].name == name) return static_cast<int>(i);
  return -1;
}

enum class View { kDense, kCsc, kCsr };

// The layout of stream `s` when it can be read as `view` and the batch's values are of type T.
template <typename T>
absl::StatusOr<const StreamLayout*> CheckedStream(const BatchPlan& plan, size_t s, View view) {
  if (s >= plan.streams.size()) return absl::InvalidArgumentError("no such stream");
  const StreamLayout& L = plan.streams[s];
  const bool fits = view == View::kDense ? L.dense_values() : (view == View::kCsc ? L.csc() : L.csr());
  if (!fits) {
    const char* delivered = L.ids() ? "ids" : L.dense_values() ? "dense" : (L.csr() ? "CSR" : (L.csc() ? "CSC" : StreamFormatName(L.format)));
    const char* asked = view == View::kDense ? "dense" : (view == View::kCsc ? "CSC" : "CSR");
    return absl::InvalidArgumentError(absl::StrCat("stream '", L.name, "' was delivered as ", delivered,
                                                   ", not ", asked, " (choose with the subscription's layouts)"));
  }
  // The element type must be the values' own: float or double (the batch's precision), or
  // uint16_t for values narrowed to float16 or bfloat16 (their bit patterns).
  const DType want = std::is_same<T, uint16_t>::value ? L.values.dtype
                     : std::is_same<T, float>::value  ? DType::kFloat32
                                                      : DType::kFloat64;
  const bool narrowed = L.values.dtype == DType::kFloat16 || L.values.dtype == DType::kBFloat16;
  if (L.values.dtype != want || (std::is_same<T, uint16_t>::value && !narrowed)) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", L.name, "' holds ", DTypeName(L.values.dtype),
                                                   " values: read them as ",
                                                   narrowed ? "uint16_t (the bit patterns)"
                                                   : L.values.dtype == DType::kFloat32 ? "float" : "double"));
  }
  return &L;
}

template <typename T>
absl::StatusOr<DenseView<T>> ReceivedBatch::Dense(size_t s) const {
  auto checked = CheckedStream<T>(plan_, s, View::kDense);
  if (!checked.ok()) return checked.status();
  const StreamLayout& L = **checked;
  DenseView<T> v;
  v.data = reinterpret_cast<const T*>(data_ + L.values.offset);
  v.rows = plan_.shape.rows;
  v.steps = L.sequence_axis ? L.max_length : 1;
  v.dim = L.dim;
  v.lengths = L.lengths.present() ? reinterpret_cast<const int32_t*>(data_ + L.lengths.offset) : nullptr;
  return v;
}

// The fields CSC and CSR views share: values, shape and lengths.
template <typename T, typename View>
void FillCompressed(const BatchPlan& plan, const StreamLayout& L, const char* data, View* v) {
  v->values = reinterpret_cast<const T*>(data + L.values.offset);
  v->steps = L.sequence_axis ? L.max_length : 1;
  v->columns = plan.shape.rows * v->steps;
  v->nnz = L.nnz;
  v->dim = L.dim;
  v->lengths = L.lengths.present() ? reinterpret_cast<const int32_t*>(data + L.lengths.offset) : nullptr;
}

template <typename T>
absl::StatusOr<CscView<T>> ReceivedBatch::Csc(size_t s) const {
  auto checked = CheckedStream<T>(plan_, s, View::kCsc);
  if (!checked.ok()) return checked.status();
  const StreamLayout& L = **checked;
  CscView<T> v;
  v.colptr = data_ + L.colptr.offset;
  v.colptr64 = L.colptr.dtype == DType::kInt64;
  v.rowind = reinterpret_cast<const int32_t*>(data_ + L.rowind.offset);
  FillCompressed<T>(plan_, L, data_, &v);
  return v;
}

template <typename T>
absl::StatusOr<CsrView<T>> ReceivedBatch::Csr(size_t s) const {
  auto checked = CheckedStream<T>(plan_, s, View::kCsr);
  if (!checked.ok()) return checked.status();
  const StreamLayout& L = **checked;
  CsrView<T> v;
  v.rowptr = data_ + L.rowptr.offset;
  v.rowptr64 = L.rowptr.dtype == DType::kInt64;
  v.colind = reinterpret_cast<const int32_t*>(data_ + L.colind.offset);
  FillCompressed<T>(plan_, L, data_, &v);
  return v;
}

absl::StatusOr<IdsView> ReceivedBatch::Ids(size_t s) const {
  if (s >= plan_.streams.size()) return absl::InvalidArgumentError("no such stream");
  const StreamLayout& L = plan_.streams[s];
  if (!L.ids()) return absl::InvalidArgumentError(absl::StrCat("stream '", L.name, "' is ", StreamFormatName(L.format), ", not ids"));
  IdsView v;
  v.data = reinterpret_cast<const int32_t*>(data_ + L.values.offset);
  v.rows = plan_.shape.rows;
  v.steps = L.sequence_axis ? L.max_length : 1;
  v.lengths = L.lengths.present() ? reinterpret_cast<const int32_t*>(data_ + L.lengths.offset) : nullptr;
  return v;
}

template absl::StatusOr<DenseView<float>> ReceivedBatch::Dense<float>(size_t) const;
template absl::StatusOr<DenseView<double>> ReceivedBatch::Dense<double>(size_t) const;
template absl::StatusOr<CscView<float>> ReceivedBatch::Csc<float>(size_t) const;
template absl::StatusOr<CscView<double>> ReceivedBatch::Csc<double>(size_t) const;
template absl::StatusOr<CsrView<float>> ReceivedBatch::Csr<float>(size_t) const;
template absl::StatusOr<CsrView<double>> ReceivedBatch::Csr<double>(size_t) const;
template absl::StatusOr<DenseView<uint16_t>> ReceivedBatch::Dense<uint16_t>(size_t) const;
template absl::StatusOr<CscView<uint16_t>> ReceivedBatch::Csc<uint16_t>(size_t) const;
template absl::StatusOr<CsrView<uint16_t>> ReceivedBatch::Csr<uint16_t>(size_t) const;

// ------------------------------------------------------------------ Subscription

Subscription::Subscription(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels,
                           size_t first, v1::Subscribe request, SubscribeOptions options, std::string token,
                           ClientLimits limits)
    : addresses_(std::move(addresses)), channels_(std::move(channels)), current_(first),
      request_(std::move(request)), options_(options),
      token_(std::move(token)), limits_(limits), reader_(limits), part_(std::make_unique<SlicePart>()) {}

Subscription::~Subscription() { Cancel(); }

void Subscription::Cancel() {
  if (context_) context_->TryCancel();
  if (stream_) stream_->Finish();
  stream_.reset();
  context_.reset();
}

absl::Status Subscription::Open() {
  context_ = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) context_->AddMetadata("authorization", "Bearer " + token_);
  // The headers go with the first write (which the idle deadline bounds): otherwise creating
  // the call blocks until they are sent, as long as connecting to a frozen daemon takes.
  context_->set_initial_metadata_corked(true);
  static const grpc::internal::RpcMethod kStream("/conveyor.v1.Loader/Stream", grpc::internal::RpcMethod::BIDI_STREAMING);
  stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
      channels_[current_].get(), kStream, context_.get()));
  reader_ = StreamReader(limits_);
  has_unacked_ = false;
  segments_.clear();  // a new stream announces its own segments (batches in hand keep theirs)
  device_segments_.clear();
  v1::StreamRequest first;
  *first.mutable_subscribe() = request_;
  // Batches of one-sample rows come with their keys only (proto: Pieces.single_sample_rows);
  // DescriptorToPlan puts the pieces back together in the plan.
  first.mutable_subscribe()->set_compact_pieces(true);
  if (!last_cursor_.empty() && last_cursor_ != request_.resume_cursor()) {
    // Resumed after the last batch handed out: the resumed stream starts at the batch after
    // it, so the next batch of this subscription (`stride` batches on) is at offset stride - 1
    // of it; and the cursor says where the stream is (a first epoch would be refused).
    v1::Subscribe* s = first.mutable_subscribe();
    s->set_resume_cursor(last_cursor_);
    if (s->batch_stride() > 1) s->set_batch_offset(s->batch_stride() - 1);
    s->clear_first_epoch();
  }
  // A failed write shows up in the reads: the call ended (what the daemon sent before is
  // still read and checked, then Finish() gives the status). Finish() here could block: it
  // waits for messages nobody reads. A write that waits past the idle deadline (a daemon
  // that accepted the connection and froze) is cancelled.
  if (!Write(first)) return Abort(IdleError());
  return absl::OkStatus();
}

struct Subscription::DeviceMapping {
  void* data = nullptr;
  uint64_t size = 0;
  int device = 0;
  ~DeviceMapping() { gpu::CloseIpcHandle(data, device); }
};

absl::Status Subscription::OpenDeviceSegment(const v1::CudaIpcSegment& s) {
  if (s.handle().size() != gpu::kIpcHandleBytes || s.device_uuid().size() != gpu::kDeviceUuidBytes || s.bytes() == 0 ||
      s.bytes() > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError("a CUDA IPC segment announcement is malformed");
  }
  auto device = gpu::DeviceByUuid(s.device_uuid());
  if (!device.ok()) return device.status();
  auto p = gpu::OpenIpcHandle(s.handle(), *device);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(p.status().message(),
                                                        " (CUDA IPC needs the daemon on this host, with access to the device)"));
  }
  auto m = std::make_shared<DeviceMapping>();
  m->data = *p;
  m->size = s.bytes();
  m->device = *device;
  device_segments_[s.id()] = std::move(m);
  return absl::OkStatus();
}

absl::Status Subscription::Abort(absl::Status why) {
  if (context_) context_->TryCancel();
  if (stream_) (void)stream_->Finish();
  stream_.reset();
  return why;
}

bool Subscription::Write(const v1::StreamRequest& request) {
  grpc::ByteBuffer buffer;
  bool own = false;
  if (!grpc::SerializationTraits<v1::StreamRequest>::Serialize(request, &buffer, &own).ok()) return true;
  const bool timed = options_.idle_timeout.count() > 0;
  if (timed) watchdog_.Arm(context_.get(), options_.idle_timeout);
  (void)stream_->Write(buffer);
  return !(timed && watchdog_.Disarm());
}

absl::Status Subscription::IdleError() const {
  return absl::UnavailableError(absl::StrCat("no message from the daemon at ", address(), " for ",
                                             options_.idle_timeout.count(), " ms (the idle deadline)"));
}

Subscription::ReadResult Subscription::Read(v1::StreamResponse* msg, bool* split, std::chrono::milliseconds timeout) {
  grpc::ByteBuffer buffer;
  if (timeout.count() > 0) watchdog_.Arm(context_.get(), timeout);
  const bool got = stream_->Read(&buffer);
  if (timeout.count() > 0 && watchdog_.Disarm()) return ReadResult::kIdle;
  if (!got) return ReadResult::kEnded;
  // An inline part's bytes stay in the received slices (part_), copied once, into the batch.
  if (!ParseStreamResponse(buffer, msg, part_.get(), split)) return ReadResult::kUnparsable;
  if (*split) {
    ++wire_stats_.parts;
    if (part_->slices_spanned() > 1) ++wire_stats_.parts_in_pieces;
  }
  return ReadResult::kMessage;
}

absl::StatusOr<bool> Subscription::Receive(ReceivedBatch* out) {
  while (true) {
    v1::StreamResponse msg;
    bool split = false;
    const ReadResult read = Read(&msg, &split, options_.idle_timeout);
    if (read == ReadResult::kUnparsable) {
      return Abort(absl::InvalidArgumentError("the daemon sent a message that does not parse as a StreamResponse"));
    }
    if (read == ReadResult::kIdle) return Abort(IdleError());
    if (read == ReadResult::kEnded) {
      // The call ended: its status, or (OK) whether the stream's data really ended.
      grpc::Status st = stream_->Finish();
      stream_.reset();
      if (st.error_code() == grpc::StatusCode::CANCELLED) {
        // Not by this client (its own cancels return before reading): a daemon shutting down
        // cancels the calls it has not ended, a broken stream to resume like any other.
        return absl::UnavailableError(absl::StrCat("the daemon at ", address(), " cancelled the stream (",
                                                   st.error_message(), ")"));
      }
      if (!st.ok()) return FromGrpc(st);
      absl::Status finished = reader_.Finished();
      // Broken off, not wrong: resumable from the last cursor like a daemon that went away.
      return absl::UnavailableError(finished.message());
    }
    auto event = reader_.Feed(std::move(msg), split ? part_.get() : nullptr);
    part_->Release();  // the part is in the batch (or refused): gRPC's buffers go back
    if (!event.ok()) return Abort(event.status());
    switch (*event) {
      case StreamReader::Event::kNeedMore:
        continue;
      case StreamReader::Event::kSegment: {
        auto mapped = MapSharedSegment(reader_.segment());
        if (!mapped.ok()) return Abort(mapped.status());
        segments_[reader_.segment().id()] = std::move(*mapped);
        continue;
      }
      case StreamReader::Event::kCudaSegment: {
        absl::Status opened = OpenDeviceSegment(reader_.cuda_segment());
        if (!opened.ok()) return Abort(opened);
        continue;
      }
      case StreamReader::Event::kEnd: {
        // The daemon ends the call right after the end of the stream: one more read says so
        // (never Finish() on a call that may stay open). A message there is a protocol error;
        // a call held open past the grace is cancelled, the data being complete.
        stream_->WritesDone();
        v1::StreamResponse after;
        bool after_split = false;
        const ReadResult last = Read(&after, &after_split, kEndGrace);
        if (last == ReadResult::kMessage) {
          return Abort(reader_.Feed(std::move(after), after_split ? part_.get() : nullptr).status());
        }
        if (last == ReadResult::kUnparsable) {
          return Abort(absl::InvalidArgumentError("the daemon sent a message after the end of the stream"));
        }
        ended_ = true;
        if (last == ReadResult::kIdle) {
          (void)Abort(absl::OkStatus());
          return false;
        }
        grpc::Status st = stream_->Finish();
        stream_.reset();
        if (!st.ok()) return FromGrpc(st);
        return false;
      }
      case StreamReader::Event::kBatch:
        break;
    }
    StreamReader::ReceivedBatch& got = reader_.batch();
    ReceivedBatch& b = *out;
    b.descriptor_ = std::move(got.descriptor);
    b.plan_ = std::move(got.plan);
    b.bytes_ = std::move(got.bytes);
    b.mapping_.reset();
    b.on_device_ = false;
    b.device_ = -1;
    const uint64_t total = b.descriptor_.total_bytes();
    if (b.descriptor_.has_cuda_ipc()) {
      auto it = device_segments_.find(b.descriptor_.cuda_ipc().segment());
      if (it == device_segments_.end()) return Abort(absl::InvalidArgumentError("a batch lies outside its CUDA IPC segment"));
      b.mapping_ = it->second;
      b.data_ = static_cast<const char*>(it->second->data) + b.descriptor_.cuda_ipc().offset();
      b.size_ = total;
      b.on_device_ = true;
      b.device_ = it->second->device;
    } else if (b.descriptor_.has_shm()) {
      auto it = segments_.find(b.descriptor_.shm().segment());
      const uint64_t at = b.descriptor_.shm().offset();
      if (it == segments_.end() || at > it->second->size || total > it->second->size - at) {
        return Abort(absl::InvalidArgumentError("a batch lies outside its shared-memory segment"));
      }
      b.mapping_ = it->second;
      b.data_ = it->second->data + at;
      b.size_ = total;
      absl::Status valid = ValidateBatchBytes(b.plan_, {reinterpret_cast<const std::byte*>(b.data_), b.size_});
      if (!valid.ok()) {
        return Abort(absl::InvalidArgumentError(absl::StrCat("batch ", b.descriptor_.serial(), ": ", valid.message())));
      }
    } else {
      b.data_ = b.bytes_.data();
      b.size_ = b.bytes_.size();
    }
    has_unacked_ = true;
    unacked_serial_ = b.descriptor_.serial();
    last_cursor_ = b.descriptor_.cursor();
    return true;
  }
}

absl::StatusOr<bool> Subscription::Next(ReceivedBatch* out) {
  if (ended_) return false;
  while (true) {
    absl::Status st;
    if (!stream_) st = Open();
    if (st.ok() && has_unacked_) {
      v1::StreamRequest ack;
      ack.mutable_ack()->set_serial(unacked_serial_);
      has_unacked_ = false;
      if (!Write(ack)) st = Abort(IdleError());  // a failed write shows up in the next Read
    }
    if (st.ok()) {
      auto r = Receive(out);
      if (r.ok()) {
        reconnects_ = 0;
        return r;
      }
      st = r.status();
    }
    // A broken stream (daemon gone, draining): resume from the last cursor received, on the
    // next daemon; back off once every daemon has been tried.
    const int limit = options_.max_reconnects * static_cast<int>(channels_.size());
    if (!absl::IsUnavailable(st) || !options_.reconnect || reconnects_ >= limit) {
      if (absl::IsUnavailable(st) && absl::StrContains(st.message(), "failed to connect")) {
        // gRPC's own words name the address but not what to check. A handshake that failed
        // (TLS, or a connection closed at once) reached something listening: not asked then.
        const bool reached = absl::StrContains(st.message(), "Ssl") || absl::StrContains(st.message(), "SSL") ||
                             absl::StrContains(st.message(), "certificate") ||
                             absl::StrContains(st.message(), "Socket closed");
        const std::string tried =
            options_.reconnect ? absl::StrCat("tried ", reconnects_ + 1, " times") : std::string();
        return absl::UnavailableError(absl::StrCat(
            "cannot reach a daemon at ", absl::StrJoin(addresses_, ","), " (",
            reached ? tried : absl::StrCat("is conveyord running and listening there?", tried.empty() ? "" : " ", tried),
            reached && tried.empty() ? "a handshake failed" : "", "): ", st.message()));
      }
      return st;
    }
    ++reconnects_;
    Cancel();
    if (channels_.size() > 1) {
      current_ = (current_ + 1) % channels_.size();
    }
    if (reconnects_ % channels_.size() == 0 || channels_.size() == 1) {
      const int round = reconnects_ / static_cast<int>(channels_.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(100 << std::min(round, 5)));
    }
  }
}

// ------------------------------------------------------------------ Client

namespace {

// The stream's receive window: what the daemon may send ahead of the reader (its credits
// bound that too: 8 batches of 1.6 MB fit). The HTTP/2 limit on a DATA frame (2^24 - 1).
constexpr int kReceiveWindow = 16 << 20;
constexpr int kMaxFrameSize = (1 << 24) - 1;

}  // namespace

Client::Client(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels,
               std::string token, ClientLimits limits)
    : addresses_(std::move(addresses)), channels_(std::move(channels)), token_(std::move(token)), limits_(limits) {
  for (const auto& c : channels_) stubs_.push_back(v1::Loader::NewStub(c));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address, const ClientOptions& options) {
  std::vector<std::string> addresses;
  for (absl::string_view a : absl::StrSplit(address, ',', absl::SkipWhitespace())) {
    addresses.emplace_back(absl::StripAsciiWhitespace(a));
  }
  if (addresses.empty()) {
    return absl::InvalidArgumentError("empty daemon address (expected host:port, unix:/path or dns:///name:port)");
  }
  if (addresses.size() > 64) return absl::InvalidArgumentError("at most 64 daemon addresses");
  for (const std::string& a : addresses) {
    // gRPC takes a port past 65535 and wraps it ("127.0.0.1:99999" dials port 34463).
    if (absl::StartsWith(a, "unix:") || absl::StartsWith(a, "unix-abstract:")) continue;
    const size_t colon = a.rfind(':');
    if (colon == std::string::npos || a.find(']', colon) != std::string::npos) continue;
    const std::string port = a.substr(colon + 1);
    const size_t digits = port.find_first_not_of('0');  // leading zeros are not a port's size
    if (!port.empty() && port.find_first_not_of("0123456789") == std::string::npos && digits != std::string::npos &&
        (port.size() - digits > 5 || std::stoul(port.substr(digits)) > 65535)) {
      return absl::InvalidArgumentError(absl::StrCat("daemon address '", a, "': ", port.substr(0, 32),
                                                     " is not a TCP port (0 to 65535)"));
    }
  }
  grpc::ChannelArguments args;
  // A message holds a descriptor and at most one inline part (the daemon's parts are at most
  // 64 MiB); a batch of millions of pieces has a larger descriptor, within the batch limit.
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<uint64_t>(options.limits.max_batch_bytes + (64 << 20), INT32_MAX)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Flow control sized for batches of megabytes (bench/RESULTS.md, "Issue 19: inline stream,
  // part 2"): a fixed receive window of kReceiveWindow bytes instead of BDP probing, which
  // started each connection at 64 KiB and pinged and updated the window all along (10-15%
  // of the daemon's CPU per GB on loopback); the daemon's credits bound what it sends ahead
  // anyway. DATA frames as large as HTTP/2 allows, so that a part is not cut every 16 KiB.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kReceiveWindow);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameSize);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& a : addresses) channels.push_back(grpc::CreateCustomChannel(a, creds, args));
  return std::unique_ptr<Client>(new Client(std::move(addresses), std::move(channels), options.token, options.limits));
}

grpc::Status Client::Unary(const std::function<grpc::Status(v1::Loader::Stub*, grpc::ClientContext*)>& call) {
  grpc::Status st;
  for (size_t tried = 0; tried < stubs_.size(); ++tried) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    st = call(stubs_[current_].get(), &ctx);
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) return st;
    current_ = (current_ + 1) % stubs_.size();
  }
  return st;
}

absl::StatusOr<std::vector<std::string>> Client::ListDatasets() {
  v1::ListDatasetsResponse resp;
  grpc::Status st = Unary([&](v1::Loader::Stub* stub, grpc::ClientContext* ctx) {
    return stub->ListDatasets(ctx, v1::ListDatasetsRequest(), &resp);
  });
  if (!st.ok()) return FromGrpc(st);
  return std::vector<std::string>(resp.datasets().begin(), resp.datasets().end());
}

absl::StatusOr<v1::DatasetDescription> Client::Describe(const std::string& dataset) {
  v1::DescribeDatasetRequest req;
  req.set_dataset(dataset);
  v1::DatasetDescription resp;
  grpc::Status st = Unary([&](v1::Loader::Stub* stub, grpc::ClientContext* ctx) {
    return stub->DescribeDataset(ctx, req, &resp);
  });
  if (!st.ok()) return FromGrpc(st);
  return resp;
}

absl::StatusOr<std::unique_ptr<Subscription>> Client::Subscribe(const v1::Subscribe& request,
                                                                const SubscribeOptions& options) {
  auto sub = std::unique_ptr<Subscription>(
      new Subscription(addresses_, channels_, current_, request, options, token_, limits_));
  if (!request.resume_cursor().empty()) sub->last_cursor_ = request.resume_cursor();
  return sub;
}

}  // namespace conveyor
