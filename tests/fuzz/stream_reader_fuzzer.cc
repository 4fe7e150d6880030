// libFuzzer harness for the C++ client's reading of a Stream call (proto/stream_reader.h:
// the reassembly of inline parts, serials, segments, DescriptorToPlan and
// ValidateBatchBytes). The input is a sequence of records (a 4-byte little-endian length,
// then that many bytes of a StreamResponse), as tests/fuzz/make_stream_corpus.py writes
// them. Every batch the reader accepts is then read the way the dump writer reads it
// (every array, piece and pointer), so that ASan catches any read outside the batch that
// the checks let through.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/batch/dump_writer.h"
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
    conveyor::v1::StreamResponse message;
    if (!message.ParseFromArray(data + at, static_cast<int>(len))) return 0;  // the client's error
    at += len;
    auto event = reader.Feed(std::move(message));
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
