// libFuzzer: arbitrary bytes as a CNTK binary file. Header, index and every chunk are read
// with all of the file's streams; any input must end in a status, never a read out of bounds
// (ASan) or undefined behaviour (UBSan).
#include <cstddef>
#include <cstdint>
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
    (void)chunk;
  }
  return 0;
}
