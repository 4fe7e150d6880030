#include "server/transports/transport.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/io/coded_stream.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "cuda/slot_pool.h"

namespace conveyor {
namespace {

using google::protobuf::io::CodedOutputStream;

// The fields of BatchDescriptor that protobuf writes after `payload`.
const std::vector<const google::protobuf::FieldDescriptor*>& FieldsAfterPayload() {
  static const auto* fields = [] {
    auto* f = new std::vector<const google::protobuf::FieldDescriptor*>;
    const google::protobuf::Descriptor* d = v1::BatchDescriptor::descriptor();
    const int payload = v1::BatchDescriptor::kPayloadFieldNumber;
    for (int i = 0; i < d->field_count(); ++i)
      if (d->field(i)->number() > payload) f->push_back(d->field(i));
    return f;
  }();
  return *fields;
}

uint8_t* Tag(int field, uint8_t* p) {
  return CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(field) << 3 | 2 /* length-delimited */, p);
}
size_t TagSize(int field) { return CodedOutputStream::VarintSize32(static_cast<uint32_t>(field) << 3 | 2); }

// The slice's hold on the payload's memory.
void DropHold(void* hold) { delete static_cast<std::shared_ptr<const void>*>(hold); }

}  // namespace

grpc::ByteBuffer OutgoingMessage::Encode() {
  grpc::ByteBuffer out;
  if (payload == nullptr || !(message.has_batch() || message.has_more())) {
    bool own = false;
    (void)grpc::SerializationTraits<v1::StreamResponse>::Serialize(message, &out, &own);
    return out;
  }
  // message = kind { head, payload { data, rest }, tail }, written as protobuf writes it
  // (fields in number order, the payload's `data` first): one slice for everything up to
  // the data's bytes, one over the bytes, one for the rest.
  const bool batch = message.has_batch();
  google::protobuf::Message* head;
  v1::BatchDescriptor tail;  // a batch's fields after `payload` (a part has none)
  v1::InlinePayload rest;
  int kind, payload_field;
  if (batch) {
    v1::BatchDescriptor* d = message.mutable_batch();
    rest.set_offset(d->payload().offset());
    d->clear_payload();
    d->GetReflection()->SwapFields(d, &tail, FieldsAfterPayload());
    head = d;
    kind = v1::StreamResponse::kBatchFieldNumber;
    payload_field = v1::BatchDescriptor::kPayloadFieldNumber;
  } else {
    v1::MoreBytes* m = message.mutable_more();
    rest.set_offset(m->payload().offset());
    m->clear_payload();
    head = m;
    kind = v1::StreamResponse::kMoreFieldNumber;
    payload_field = v1::MoreBytes::kPayloadFieldNumber;
  }
  const size_t head_bytes = head->ByteSizeLong(), tail_bytes = batch ? tail.ByteSizeLong() : 0;
  const size_t rest_bytes = rest.ByteSizeLong();
  // proto3: empty bytes are not written.
  const size_t data_field = size == 0 ? 0 : TagSize(v1::InlinePayload::kDataFieldNumber) +
                                                CodedOutputStream::VarintSize64(size) + size;
  const uint64_t payload_bytes = data_field + rest_bytes;
  const uint64_t kind_bytes = head_bytes + TagSize(payload_field) + CodedOutputStream::VarintSize64(payload_bytes) +
                              payload_bytes + tail_bytes;
  const size_t first_bytes = TagSize(kind) + CodedOutputStream::VarintSize64(kind_bytes) + head_bytes +
                             TagSize(payload_field) + CodedOutputStream::VarintSize64(payload_bytes) +
                             (size == 0 ? 0 : data_field - size);
  grpc::Slice slices[3];
  size_t n = 0;
  {
    grpc::Slice first(first_bytes);
    uint8_t* p = const_cast<uint8_t*>(first.begin());  // a fresh slice of our own
    p = Tag(kind, p);
    p = CodedOutputStream::WriteVarint64ToArray(kind_bytes, p);
    p = head->SerializeWithCachedSizesToArray(p);
    p = Tag(payload_field, p);
    p = CodedOutputStream::WriteVarint64ToArray(payload_bytes, p);
    if (size > 0) {
      p = Tag(v1::InlinePayload::kDataFieldNumber, p);
      p = CodedOutputStream::WriteVarint64ToArray(size, p);
    }
    slices[n++] = std::move(first);
  }
  if (size > 0) {
    auto* hold = new std::shared_ptr<const void>(memory != nullptr ? memory : std::shared_ptr<const void>(payload));
    std::byte* bytes = const_cast<std::byte*>(payload.get()) + offset;  // gRPC only reads it
    slices[n++] = grpc::Slice(bytes, size, &DropHold, hold);
  }
  if (rest_bytes + tail_bytes > 0) {
    grpc::Slice last(rest_bytes + tail_bytes);
    uint8_t* p = const_cast<uint8_t*>(last.begin());
    p = rest.SerializeWithCachedSizesToArray(p);
    if (tail_bytes > 0) tail.SerializeWithCachedSizesToArray(p);
    slices[n++] = std::move(last);
  }
  message.Clear();
  return grpc::ByteBuffer(slices, n);
}

void OutgoingMessage::Materialize() {
  if (payload == nullptr) return;
  v1::InlinePayload* p = message.has_batch() ? message.mutable_batch()->mutable_payload()
                                             : message.mutable_more()->mutable_payload();
  p->set_data(reinterpret_cast<const char*>(payload.get()) + offset, size);
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> Transport::MakeAssembler() {
  // The CUDA assembler overlaps by itself (the device assembles batch k while the host
  // plans k+1). The CPU one stays synchronous: on a worker thread of its own it cost CPU
  // time and gained no throughput here (bench/RESULTS.md, "Pipelined assembly").
  std::string note;
  std::unique_ptr<BatchAssembler> assembler =
      SelectAssembler(options_.cuda_assembler, options_.cuda_device, &note, options_.staging_bytes);
  if (std::string_view(assembler->name()) == "cuda") lock_for_device_ = options_.cuda_device;
  if (options_.pipelined_cpu_assembly && !assembler->pipelined()) {
    assembler = MakePipelinedAssembler(std::move(assembler));
  }
  return assembler;
}

std::unique_ptr<gpu::HostRegistration> Transport::LockForAssembler(void* data, uint64_t bytes) {
  if (lock_for_device_ < 0) return nullptr;
  absl::StatusOr<std::unique_ptr<gpu::HostRegistration>> locked =
      gpu::RegisterHostMemory(data, bytes, lock_for_device_);
  if (locked.ok()) return std::move(*locked);
  if (!lock_failure_logged_) {
    lock_failure_logged_ = true;
    std::fprintf(stderr,
                 "WARNING: %s transport: %s; this stream's batches come back from the GPU through a pinned "
                 "buffer of the assembler's instead (one more host copy each)\n",
                 name(), std::string(locked.status().message()).c_str());
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Transport::Destination>> Transport::Reserve(uint64_t serial,
                                                                           uint64_t bytes) {
  if (static_cast<unsigned __int128>(bytes) * credits_ > options_.subscription_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch ", serial, " of ", bytes, " bytes x ", credits_,
                     " credits exceeds the subscription budget server.subscriptionBytes (",
                     options_.subscription_bytes,
                     " bytes): ask for fewer credits or smaller batches (a sparse stream as CSC or "
                     "CSR rather than dense)"));
  }
  return ReserveChecked(serial, bytes);
}

}  // namespace conveyor
