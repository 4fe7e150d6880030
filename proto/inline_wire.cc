#include "proto/inline_wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <utility>

namespace conveyor {
namespace {

constexpr int kLengthDelimited = 2;

// A position-keeping reader over the message's slices. Every read is bounded; running off
// the end makes it fail (and every later read too).
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) total_ += s.size();
    Settle();
  }
  uint64_t pos() const { return pos_; }
  uint64_t total() const { return total_; }
  bool failed() const { return failed_; }
  size_t slice() const { return index_; }
  size_t offset() const { return offset_; }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (index_ >= slices_.size()) return Fail();
      const uint8_t b = slices_[index_].begin()[offset_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return Fail();
  }
  bool Skip(uint64_t n) {
    if (n > total_ - pos_) return Fail();
    Advance(n);
    return true;
  }
  // Skips the value of a field of wire type `type` (groups are not taken).
  bool SkipValue(uint32_t type) {
    uint64_t v;
    switch (type) {
      case 0:
        return Varint(&v);
      case 1:
        return Skip(8);
      case kLengthDelimited:
        return Varint(&v) && Skip(v);
      case 5:
        return Skip(4);
      default:
        return Fail();
    }
  }
  // Appends bytes [from, to) of the message (both within it) to `out`.
  void Copy(uint64_t from, uint64_t to, std::string* out) const {
    uint64_t at = 0;
    for (const grpc::Slice& s : slices_) {
      const uint64_t begin = std::max(from, at), end = std::min(to, at + s.size());
      if (begin < end) out->append(reinterpret_cast<const char*>(s.begin()) + (begin - at), end - begin);
      at += s.size();
      if (at >= to) break;
    }
  }

 private:
  bool Fail() {
    failed_ = true;
    return false;
  }
  void Advance(uint64_t n) {
    pos_ += n;
    while (n > 0) {
      const uint64_t here = std::min<uint64_t>(n, slices_[index_].size() - offset_);
      offset_ += here;
      n -= here;
      Settle();
    }
  }
  // Moves past the ends of slices (and empty ones).
  void Settle() {
    while (index_ < slices_.size() && offset_ >= slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  uint64_t total_ = 0, pos_ = 0;
  size_t index_ = 0, offset_ = 0;
  bool failed_ = false;
};

// The split of a batch or part message: its fields but the payload ([begin, payload) and
// [payload_end, end)), the payload's data, and the payload's fields after the data.
struct Split {
  int kind = 0;
  uint64_t begin = 0, payload = 0, payload_end = 0, end = 0;
  uint64_t rest = 0;  // the payload's fields after its data: [rest, payload_end)
  size_t data_slice = 0, data_offset = 0;
  uint64_t data_size = 0;
};

// Finds the split of the message under `c`, or false where protobuf must parse it whole: not
// exactly one kind field that is a batch or a part; its payload absent, repeated, or not
// starting with non-empty data; the data repeated later in the payload; or a field of a
// wire type protobuf would have to judge (groups, and anything malformed).
bool FindSplit(SliceCursor* c, Split* s) {
  uint64_t tag, len;
  if (!c->Varint(&tag) || (tag >> 3 != v1::StreamResponse::kBatchFieldNumber && tag >> 3 != v1::StreamResponse::kMoreFieldNumber) ||
      (tag & 7) != kLengthDelimited || !c->Varint(&len) || len != c->total() - c->pos()) {
    return false;
  }
  s->kind = static_cast<int>(tag >> 3);
  const uint64_t payload_field = s->kind == v1::StreamResponse::kBatchFieldNumber
                                     ? uint64_t{v1::BatchDescriptor::kPayloadFieldNumber}
                                     : uint64_t{v1::MoreBytes::kPayloadFieldNumber};
  s->begin = c->pos();
  s->end = c->total();
  bool found = false;
  while (c->pos() < s->end) {
    const uint64_t field_begin = c->pos();
    if (!c->Varint(&tag)) return false;
    if (tag >> 3 != payload_field) {
      if (!c->SkipValue(static_cast<uint32_t>(tag & 7))) return false;
      continue;
    }
    if (found || (tag & 7) != kLengthDelimited || !c->Varint(&len) || len > s->end - c->pos()) return false;
    found = true;
    s->payload = field_begin;
    s->payload_end = c->pos() + len;
    // The payload: its data first.
    uint64_t data_tag, data_len;
    if (!c->Varint(&data_tag) || data_tag != (uint64_t{v1::InlinePayload::kDataFieldNumber} << 3 | kLengthDelimited) ||
        !c->Varint(&data_len) || data_len == 0 || data_len > s->payload_end - c->pos()) {
      return false;
    }
    s->data_slice = c->slice();
    s->data_offset = c->offset();
    s->data_size = data_len;
    if (!c->Skip(data_len)) return false;
    s->rest = c->pos();
    while (c->pos() < s->payload_end) {
      if (!c->Varint(&tag) || tag >> 3 == v1::InlinePayload::kDataFieldNumber || !c->SkipValue(static_cast<uint32_t>(tag & 7))) {
        return false;
      }
    }
    if (c->pos() != s->payload_end) return false;
  }
  return found && c->pos() == s->end && !c->failed();
}

}  // namespace

void SlicePart::AppendTo(std::string* out) const {
  uint64_t left = size_;
  size_t offset = offset_;
  for (size_t i = first_; left > 0 && i < slices_.size(); ++i, offset = 0) {
    const uint64_t n = std::min<uint64_t>(left, slices_[i].size() - offset);
    out->append(reinterpret_cast<const char*>(slices_[i].begin()) + offset, n);
    left -= n;
  }
}

size_t SlicePart::slices_spanned() const {
  uint64_t left = size_;
  size_t offset = offset_, n = 0;
  for (size_t i = first_; left > 0 && i < slices_.size(); ++i, offset = 0, ++n) {
    left -= std::min<uint64_t>(left, slices_[i].size() - offset);
  }
  return n;
}

bool ParseStreamResponse(const grpc::ByteBuffer& buffer, v1::StreamResponse* msg, SlicePart* part, bool* split) {
  *split = false;
  msg->Clear();
  part->slices_.clear();
  part->size_ = 0;
  if (buffer.Dump(&part->slices_).ok()) {
    SliceCursor c(part->slices_);
    Split s;
    if (FindSplit(&c, &s)) {
      std::string fields;  // the kind's fields but the payload
      c.Copy(s.begin, s.payload, &fields);
      c.Copy(s.payload_end, s.end, &fields);
      std::string rest;
      c.Copy(s.rest, s.payload_end, &rest);
      google::protobuf::Message* kind;
      v1::InlinePayload* payload;
      if (s.kind == v1::StreamResponse::kBatchFieldNumber) {
        kind = msg->mutable_batch();
        payload = msg->mutable_batch()->mutable_payload();
      } else {
        kind = msg->mutable_more();
        payload = msg->mutable_more()->mutable_payload();
      }
      // The payload's field goes first: the other fields, parsed after it, keep their order
      // relative to each other, and none of them is the payload.
      if (!payload->ParseFromString(rest) || !kind->MergeFromString(fields)) return false;
      part->first_ = s.data_slice;
      part->offset_ = s.data_offset;
      part->size_ = s.data_size;
      *split = true;
      return true;
    }
  }
  part->slices_.clear();
  grpc::ByteBuffer copy(buffer);  // Deserialize consumes its buffer (the slices are shared)
  msg->Clear();
  return grpc::SerializationTraits<v1::StreamResponse>::Deserialize(&copy, msg).ok();
}

}  // namespace conveyor
