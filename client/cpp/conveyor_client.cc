#include "client/cpp/conveyor_client.h"
#include "cuda/ipc.h"

#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/wire.h"

namespace conveyor {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

// ------------------------------------------------------------------ ReceivedBatch

int ReceivedBatch::StreamIndex(const std::string& name) const {
  for (size_t i = 0; i < plan_.streams.size(); ++i)
    if (plan_.streams[i].name == name) return static_cast<int>(i);
  return -1;
}

absl::Status ReceivedBatch::Validate() {
  auto plan = DescriptorToPlan(descriptor_);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(*plan);
  if (size_ != plan_.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", descriptor_.serial(), " has ", size_,
                                                   " bytes, its descriptor says ", plan_.total_bytes));
  }
  if (on_device_) return absl::OkStatus();  // device memory: the host cannot look inside
  const char* base = data_;
  for (const StreamLayout& L : plan_.streams) {
    const uint64_t rows = plan_.shape.rows;
    const uint64_t T = L.sequence_axis ? L.max_length : 1;
    if (L.lengths.present()) {
      for (uint64_t r = 0; r < rows; ++r) {
        int32_t len;
        std::memcpy(&len, base + L.lengths.offset + r * 4, 4);
        if (len < 0 || static_cast<uint64_t>(len) > T) return absl::InvalidArgumentError("a length exceeds T");
      }
    }
    if (L.format != StreamFormat::kSparse || L.dense_values()) continue;
    // Pointers rise from 0 to nnz and indices stay inside the matrix: readers index safely.
    const bool csr = L.csr();
    const ArrayDesc& ptr = csr ? L.rowptr : L.colptr;
    const ArrayDesc& ind = csr ? L.colind : L.rowind;
    const uint64_t outer = csr ? L.dim : rows * T, inner = csr ? rows * T : L.dim;
    const char* what = csr ? "CSR row" : "CSC column";
    int64_t prev = 0;
    for (uint64_t c = 0; c <= outer; ++c) {
      int64_t v;
      if (ptr.dtype == DType::kInt64) {
        std::memcpy(&v, base + ptr.offset + c * 8, 8);
      } else {
        int32_t w;
        std::memcpy(&w, base + ptr.offset + c * 4, 4);
        v = w;
      }
      if ((c == 0 && v != 0) || v < prev || static_cast<uint64_t>(v) > L.nnz || (c == outer && static_cast<uint64_t>(v) != L.nnz)) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", L.name, "': bad ", what, " pointers"));
      }
      prev = v;
    }
    for (uint64_t k = 0; k < L.nnz; ++k) {
      int32_t i;
      std::memcpy(&i, base + ind.offset + k * 4, 4);
      if (i < 0 || static_cast<uint64_t>(i) >= inner) {
        return absl::InvalidArgumentError(absl::StrCat("stream '", L.name, "': ", csr ? "column" : "row", " index out of range"));
      }
    }
  }
  return absl::OkStatus();
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
  if ((plan.precision == Precision::kFloat) != std::is_same<T, float>::value) {
    return absl::InvalidArgumentError("element type does not match the batch's precision");
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

// ------------------------------------------------------------------ Subscription

Subscription::Subscription(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels,
                           size_t first, v1::Subscribe request, SubscribeOptions options, std::string token)
    : addresses_(std::move(addresses)), channels_(std::move(channels)), current_(first),
      stub_(v1::Loader::NewStub(channels_[current_])), request_(std::move(request)), options_(options),
      token_(std::move(token)) {}

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
  stream_ = stub_->Stream(context_.get());
  has_unacked_ = false;
  segments_.clear();  // a new stream announces its own segments (batches in hand keep theirs)
  device_segments_.clear();
  v1::StreamRequest first;
  *first.mutable_subscribe() = request_;
  if (!last_cursor_.empty()) first.mutable_subscribe()->set_resume_cursor(last_cursor_);
  if (!stream_->Write(first)) {
    const grpc::Status st = stream_->Finish();
    stream_.reset();  // finished: Cancel() must not finish it again
    return FromGrpc(st);
  }
  return absl::OkStatus();
}

struct Subscription::Mapping {
  const char* data = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<char*>(data), size);
  }
};

absl::Status Subscription::MapSegment(const v1::SharedMemorySegment& s) {
  sockaddr_un addr{};
  if (s.fd_socket().size() >= sizeof(addr.sun_path) || s.token().size() != 16 || s.bytes() == 0 ||
      s.bytes() > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError("a shared-memory segment announcement is malformed");
  }
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, s.fd_socket().c_str(), s.fd_socket().size() + 1);
  if (sock < 0 || ::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::send(sock, s.token().data(), 16, MSG_NOSIGNAL) != 16) {
    if (sock >= 0) ::close(sock);
    return absl::UnavailableError(absl::StrCat("cannot reach the daemon's descriptor socket ", s.fd_socket(),
                                               " (shared memory needs the same host)"));
  }
  char byte;
  iovec iov{&byte, 1};
  char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  ::close(sock);
  cmsghdr* cm = n > 0 ? CMSG_FIRSTHDR(&msg) : nullptr;
  if (cm == nullptr || cm->cmsg_type != SCM_RIGHTS) return absl::UnavailableError("the daemon sent no segment descriptor");
  int fd;
  std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < s.bytes()) {
    ::close(fd);
    return absl::InvalidArgumentError("the shared-memory segment is smaller than announced");
  }
  void* p = ::mmap(nullptr, s.bytes(), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the segment
  if (p == MAP_FAILED) return absl::ResourceExhaustedError("cannot map a shared-memory segment");
  auto m = std::make_shared<Mapping>();
  m->data = static_cast<const char*>(p);
  m->size = s.bytes();
  segments_[s.id()] = std::move(m);
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

absl::StatusOr<bool> Subscription::Receive(ReceivedBatch* out) {
  v1::StreamResponse msg;
  while (true) {
    if (!stream_->Read(&msg)) {
      grpc::Status st = stream_->Finish();
      stream_.reset();
      if (st.ok()) return absl::UnavailableError("the stream ended without an end-of-stream message");
      return FromGrpc(st);
    }
    if (msg.has_cuda_segment()) {
      absl::Status opened = OpenDeviceSegment(msg.cuda_segment());
      if (!opened.ok()) return opened;
      continue;
    }
    if (!msg.has_segment()) break;
    absl::Status mapped = MapSegment(msg.segment());
    if (!mapped.ok()) return mapped;
  }
  if (msg.has_end()) {
    ended_ = true;
    stream_->WritesDone();
    grpc::Status st = stream_->Finish();
    stream_.reset();
    if (!st.ok()) return FromGrpc(st);
    return false;
  }
  if (!msg.has_batch()) return absl::InvalidArgumentError("expected a batch from the daemon");
  ReceivedBatch& b = *out;
  b.descriptor_ = std::move(*msg.mutable_batch());
  const uint64_t total = b.descriptor_.total_bytes();
  if (total > (uint64_t{1} << 34)) return absl::InvalidArgumentError("batch larger than 16 GiB");
  b.mapping_.reset();
  b.on_device_ = false;
  b.device_ = -1;
  // A batch in a shared segment (memfd or device block): checked against the segment, then
  // handed out in place.
  auto in_segment = [&](const auto& segments, uint32_t id, uint64_t off, const char* what) -> absl::Status {
    auto it = segments.find(id);
    if (it == segments.end() || off > it->second->size || total > it->second->size - off) {
      return absl::InvalidArgumentError(absl::StrCat("a batch lies outside its ", what, " segment"));
    }
    b.mapping_ = it->second;
    b.data_ = static_cast<const char*>(it->second->data) + off;
    b.size_ = total;
    return absl::OkStatus();
  };
  auto hold = [&]() -> absl::StatusOr<bool> {
    absl::Status valid = b.Validate();
    if (!valid.ok()) return valid;
    has_unacked_ = true;
    unacked_serial_ = b.descriptor_.serial();
    last_cursor_ = b.descriptor_.cursor();
    return true;
  };
  if (b.descriptor_.has_cuda_ipc()) {
    const auto& slot = b.descriptor_.cuda_ipc();
    absl::Status st = in_segment(device_segments_, slot.segment(), slot.offset(), "CUDA IPC");
    if (!st.ok()) return st;
    b.on_device_ = true;
    b.device_ = device_segments_[slot.segment()]->device;
    return hold();
  }
  if (b.descriptor_.has_shm()) {
    const auto& slot = b.descriptor_.shm();
    absl::Status st = in_segment(segments_, slot.segment(), slot.offset(), "shared-memory");
    if (!st.ok()) return st;
    return hold();
  }
  // The first part's bytes move out of the message (no copy for a one-part batch).
  b.bytes_ = std::move(*b.descriptor_.mutable_payload()->mutable_data());
  b.descriptor_.mutable_payload()->clear_data();
  if (b.bytes_.size() > total) return absl::InvalidArgumentError("a batch's parts exceed its size");
  if (b.descriptor_.parts() > 1) b.bytes_.reserve(total);
  for (uint32_t part = 1; part < b.descriptor_.parts(); ++part) {
    v1::StreamResponse more;
    if (!stream_->Read(&more) || !more.has_more() || more.more().serial() != b.descriptor_.serial() ||
        more.more().payload().offset() != b.bytes_.size()) {
      grpc::Status st = stream_ ? stream_->Finish() : grpc::Status::OK;
      stream_.reset();
      return st.ok() ? absl::InvalidArgumentError("a batch's parts arrived out of order") : FromGrpc(st);
    }
    b.bytes_.append(more.more().payload().data());
    if (b.bytes_.size() > total) return absl::InvalidArgumentError("a batch's parts exceed its size");
  }
  b.data_ = b.bytes_.data();
  b.size_ = b.bytes_.size();
  return hold();
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
      stream_->Write(ack);  // a failed write shows up in the next Read
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
    if (!absl::IsUnavailable(st) || !options_.reconnect || reconnects_ >= limit) return st;
    ++reconnects_;
    Cancel();
    if (channels_.size() > 1) {
      current_ = (current_ + 1) % channels_.size();
      stub_ = v1::Loader::NewStub(channels_[current_]);
    }
    if (reconnects_ % channels_.size() == 0 || channels_.size() == 1) {
      const int round = reconnects_ / static_cast<int>(channels_.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(100 << std::min(round, 5)));
    }
  }
}

// ------------------------------------------------------------------ Client

Client::Client(std::vector<std::string> addresses, std::vector<std::shared_ptr<grpc::Channel>> channels,
               std::string token)
    : addresses_(std::move(addresses)), channels_(std::move(channels)), token_(std::move(token)) {
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
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& a : addresses) channels.push_back(grpc::CreateCustomChannel(a, creds, args));
  return std::unique_ptr<Client>(new Client(std::move(addresses), std::move(channels), options.token));
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
      new Subscription(addresses_, channels_, current_, request, options, token_));
  if (!request.resume_cursor().empty()) sub->last_cursor_ = request.resume_cursor();
  return sub;
}

}  // namespace conveyor
