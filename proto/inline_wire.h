// inline_wire.h: a StreamResponse as received, its inline bytes left where gRPC put them.
// An inline part (a batch's first part or a `more` part) is most of its message's bytes;
// parsed by protobuf, they are copied into the message's `data` string, and again wherever
// the batch is put together. Here the message is parsed without them (they are taken by
// reference into the received slices) and the reader copies them once, into the batch.
// The wire is unchanged: any StreamResponse parses, the split only applies to the form the
// daemon writes (one kind field; its payload once, starting with its data) and anything
// else goes to protobuf whole, so the result is always exactly protobuf's.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <string>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"
#include "proto/stream_reader.h"

namespace conveyor {

// An inline part's bytes inside the received slices (which it holds).
class SlicePart final : public PartBytes {
 public:
  uint64_t size() const override { return size_; }
  void AppendTo(std::string* out) const override;
  // Slices the bytes span (1: they could be used in place).
  size_t slices_spanned() const;
  // Lets go of the received slices (once the bytes are appended).
  void Release() {
    slices_.clear();
    size_ = 0;
  }

 private:
  friend bool ParseStreamResponse(const grpc::ByteBuffer&, v1::StreamResponse*, SlicePart*, bool*);
  std::vector<grpc::Slice> slices_;
  size_t first_ = 0;   // the slice the bytes begin in
  size_t offset_ = 0;  // ... and where in it
  uint64_t size_ = 0;
};

// Parses `buffer` into `msg`. When the message carries an inline part's bytes (non-empty
// `data` of a batch's or a part's payload), they are left out of `msg` and described by
// `part` instead, and *split is true; otherwise `msg` is the whole message. False: the
// bytes are not a StreamResponse (as protobuf says).
bool ParseStreamResponse(const grpc::ByteBuffer& buffer, v1::StreamResponse* msg, SlicePart* part, bool* split);

}  // namespace conveyor
