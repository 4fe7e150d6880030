// libFuzzer: arbitrary bytes as a CNTK binary file. Header, index and every chunk are read
// with all of the file's streams; any input must end in a status, never a read out of bounds
// (ASan) or undefined behaviour (UBSan). And the decoder must accept exactly the chunks the
// listing's checked walk (CountCbfChunk) accepts, with the same message where it refuses.
// Each chunk is decoded a second time from a copy of its bytes alone, as the deserializer
// reads it (ChunkedFileDeserializer::ReadChunk): the same status, and every value it leaves
// in place is read from that copy (a pointer past it is an ASan report).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "common/formats/cbf/cbf_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = conveyor::ReadCbfFile(bytes, "fuzz.bin");
  if (!file.ok()) return 0;
  auto index = conveyor::BuildCbfIndex(*file, bytes, "fuzz.bin");
  if (!index.ok()) return 0;
  const conveyor::Precision precision = file->streams[0].precision;
  for (const auto& s : file->streams)
    if (s.precision != precision) return 0;  // the dataset refuses mixed precision before parsing
  std::vector<int> source;
  for (size_t s = 0; s < file->streams.size(); ++s) source.push_back(static_cast<int>(s));
  for (size_t c = 0; c < file->chunks.size() && c < 64; ++c) {
    auto chunk = conveyor::ParseCbfChunk(bytes, *file, *index, c, source, precision, "fuzz.bin");
    conveyor::CbfChunkCounts counts;
    const absl::Status listed = conveyor::CountCbfChunk(bytes, *file, *index, c, source, precision, "fuzz.bin", &counts);
    if (listed != chunk.status()) {
      std::fprintf(stderr, "chunk %zu: the decoder says\n  %s\nthe listing says\n  %s\n", c,
                   chunk.status().ToString().c_str(), listed.ToString().c_str());
      __builtin_trap();
    }
    const conveyor::CbfChunkInfo& ci = file->chunks[c];
    const size_t n = ci.end - ci.offset;
    std::unique_ptr<char[]> alone(new char[n + 1]);  // +1: never a zero-size allocation
    std::memcpy(alone.get(), bytes.data() + ci.offset, n);
    auto again = conveyor::ParseCbfChunk(std::string_view(alone.get(), n), ci.offset, *file, *index, c, source,
                                         precision, "fuzz.bin");
    if (again.status() != chunk.status()) {
      std::fprintf(stderr, "chunk %zu: decoded from the file\n  %s\nfrom its bytes alone\n  %s\n", c,
                   chunk.status().ToString().c_str(), again.status().ToString().c_str());
      __builtin_trap();
    }
    if (!chunk.ok()) continue;
    // Every value the chunk leaves where it lies in its bytes is read, as the assembler
    // reads it: a pointer past them is an ASan report here.
    const size_t elem = precision == conveyor::Precision::kFloat ? 4 : 8;
    volatile uint64_t sum = 0;
    for (const conveyor::ParsedStream& ps : (*again)->streams) {
      for (uint32_t slot = 0; slot + 1 < ps.sequence_begin.size(); ++slot) {
        const uint64_t b = ps.sequence_begin[slot], e = ps.sequence_begin[slot + 1];
        if (ps.format == conveyor::StreamFormat::kDense) {
          if (e > b) {
            const std::byte* v = ps.DenseSamples(slot, b, elem);
            for (uint64_t i = 0; i < (e - b) * ps.dim * elem; ++i) sum = sum + static_cast<uint8_t>(v[i]);
          }
          continue;
        }
        for (uint64_t k = ps.nnz_begin[b]; k < ps.nnz_begin[e]; ++k) {
          sum = sum + static_cast<uint32_t>(ps.SparseIndex(slot, k));
          const std::byte* v = ps.SparseValueBytes(slot, k, elem);
          for (size_t i = 0; i < elem; ++i) sum = sum + static_cast<uint8_t>(v[i]);
        }
      }
    }
  }
  return 0;
}
