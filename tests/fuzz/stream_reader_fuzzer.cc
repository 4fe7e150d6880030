// libFuzzer harness for the C++ client's reading of a Stream call (proto/stream_reader.h:
// the reassembly of inline parts, serials, segments, DescriptorToPlan and
// ValidateBatchBytes), each message parsed as the client parses it (proto/inline_wire.h: an
// inline part left in the received slices), which must agree with protobuf. The input is a
// sequence of records (a 4-byte little-endian length, then that many bytes of a
// StreamResponse), as tests/fuzz/make_stream_corpus.py writes them. Every batch the reader accepts is then read the way the dump writer reads it
// (every array, piece and pointer), so that ASan catches any read outside the batch that
// the checks let through.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/batch/dump_writer.h"
#include "proto/inline_wire.h"
#include "proto/stream_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::ClientLimits limits;
  limits.max_batch_bytes = 1 << 20;  // keeps the dumps of accepted batches small
  conveyor::StreamReader reader(limits);
  size_t at = 0;
  while (at + 4 <= size) {
    uint32_t len;
    std::memcpy(&len, data + at, 4);
    at += 4;
    if (len > size - at) len = static_cast<uint32_t>(size - at);
    // As the client reads it (proto/inline_wire.h): from the slices gRPC received it in,
    // here two, cut where the first byte of the record says; it must agree with protobuf.
    conveyor::v1::StreamResponse message;
    const bool parses = message.ParseFromArray(data + at, static_cast<int>(len));
    const size_t cut = len == 0 ? 0 : data[at] % (len + 1);
    grpc::Slice slices[2] = {grpc::Slice(data + at, cut), grpc::Slice(data + at + cut, len - cut)};
    at += len;
    conveyor::v1::StreamResponse received;
    conveyor::SlicePart part;
    bool split = false;
    if (conveyor::ParseStreamResponse(grpc::ByteBuffer(slices, 2), &received, &part, &split) != parses) abort();
    if (!parses) return 0;  // the client's error
    auto event = reader.Feed(std::move(received), split ? &part : nullptr);
    if (!event.ok()) return 0;
    if (*event != conveyor::StreamReader::Event::kBatch) continue;
    conveyor::StreamReader::ReceivedBatch& b = reader.batch();
    if (b.descriptor.has_shm() || b.descriptor.has_cuda_ipc()) continue;  // bytes elsewhere
    std::string out;
    conveyor::AppendDump(b.descriptor.epoch(), b.descriptor.batch(), b.plan,
                         {reinterpret_cast<const std::byte*>(b.bytes.data()), b.bytes.size()},
                         b.descriptor.cursor(), &out);
  }
  (void)reader.Finished();
  return 0;
}
