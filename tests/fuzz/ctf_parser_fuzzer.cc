// libFuzzer harness: any bytes as a CTF file, indexed and parsed chunk by chunk with an
// unlimited error budget, under a configuration chosen by the first byte. Must never crash,
// hang or read out of bounds; every sequence the parser keeps must be well-formed. Each chunk
// is parsed a second time from a copy of its bytes alone, as the deserializer reads it
// (ChunkedFileDeserializer::ReadChunk): a read past them is an ASan report, and the result
// must be the same. The index is also built reading the bytes a few at a time
// (CtfIndexOptions::read): it must equal the one scanned in place.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "common/formats/ctf/ctf_indexer.h"
#include "common/formats/ctf/ctf_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace conveyor;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  CtfIndexOptions io;
  io.skip_sequence_ids = mode & 1;
  io.chunk_size = (mode & 2) ? 64 : 1 << 20;
  io.threads = 1;
  if (mode & 4) io.main_alias = "a";
  auto index = BuildCtfIndex(bytes, "fuzz.ctf", io);
  // The same index read a window at a time (as a dataset reads its file), windows of 1-16
  // bytes so that lines cross them: the same status, the same records.
  CtfIndexOptions ro = io;
  ro.read_window = 1 + (mode >> 4);
  ro.read = [bytes](uint64_t offset, uint64_t length, char* out) {
    if (offset + length > bytes.size()) std::abort();
    std::memcpy(out, bytes.data() + offset, length);
    return absl::OkStatus();
  };
  auto read = BuildCtfIndex(bytes, "fuzz.ctf", ro);
  if (read.ok() != index.ok() || read.status().message() != index.status().message()) std::abort();
  if (!index.ok()) return 0;
  if (read->sequences.size() != index->sequences.size() || read->chunks.size() != index->chunks.size() ||
      read->errors.count != index->errors.count ||
      (!index->sequences.empty() && std::memcmp(read->sequences.data(), index->sequences.data(),
                                                index->sequences.size() * sizeof(SequenceEntry)) != 0)) {
    std::abort();
  }
  CtfParserOptions po;
  po.path = "fuzz.ctf";
  po.precision = (mode & 8) ? Precision::kDouble : Precision::kFloat;
  po.streams = {{"a", "a", StreamFormat::kDense, 3, (mode & 4) != 0},
                {"b", "b", StreamFormat::kSparse, 50, false},
                {"long_name", "c", StreamFormat::kSparse, 1, false}};
  Diagnostics diagnostics(0, [](Severity, const std::string&) {});
  ErrorBudget budget(UINT64_MAX);
  CtfParser parser(po, &diagnostics, &budget);
  for (uint64_t c = 0; c < index->chunks.size(); ++c) {
    auto chunk = parser.ParseChunk(bytes, *index, c);
    if (!chunk.ok()) std::abort();  // an unlimited budget never stops
    const ParsedChunk& pc = **chunk;
    const ChunkEntry& ce = index->chunks[c];
    const size_t n = ce.end_offset - ce.begin_offset;
    std::unique_ptr<char[]> alone(new char[n + 1]);  // +1: never a zero-size allocation
    std::memcpy(alone.get(), bytes.data() + ce.begin_offset, n);
    auto again = parser.ParseChunk(std::string_view(alone.get(), n), ce.begin_offset, *index, c);
    if (!again.ok() || (*again)->keys != pc.keys || (*again)->slot_of != pc.slot_of ||
        (*again)->lengths != pc.lengths) {
      std::abort();
    }
    for (size_t k = 0; k < pc.streams.size(); ++k) {
      const ParsedStream &x = pc.streams[k], &y = (*again)->streams[k];
      if (x.sequence_begin != y.sequence_begin || x.nnz_begin != y.nnz_begin || x.indices != y.indices ||
          x.values_f32.size() != y.values_f32.size() || x.values_f64.size() != y.values_f64.size() ||
          (!x.values_f32.empty() && std::memcmp(x.values_f32.data(), y.values_f32.data(), x.values_f32.size() * 4)) ||
          (!x.values_f64.empty() && std::memcmp(x.values_f64.data(), y.values_f64.data(), x.values_f64.size() * 8))) {
        std::abort();
      }
    }
    for (const ParsedStream& s : pc.streams) {
      if (s.sequence_begin.size() != pc.num_sequences() + 1) std::abort();
      for (int32_t i : s.indices)
        if (i < 0 || static_cast<uint32_t>(i) >= s.dim) std::abort();
    }
  }
  return 0;
}
