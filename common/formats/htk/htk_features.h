// htk_features.h: HTK features listed in scp files, as CNTK's HTKFeatureDeserializer reads
// them (CNTK's "BrainScript HTKMLF Reader" page and Source/Readers/HTKDeserializers/ in
// CNTK's repository; the HTK Book for headers).
//
// scp lines: `path`, `id=path` or `id=path[s,e]` (inclusive frames, into archives); `.../`
// at the start of a path means the scp file's directory. The key is the id (or path) without
// its last extension. HTK files: 12-byte header (nSamples, sampPeriod, sampSize, parmKind),
// big-endian (little-endian files are recognised as CNTK does: by the smaller sampPeriod);
// float32 frames, or `_C` compressed int16 frames decoded as HTK defines ((x + B) / A).
// Context windows: frames t-left..t+right concatenated, edge frames of the utterance repeated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chunk/compressed.h"
#include "common/formats/deserializer.h"

namespace conveyor {

struct HtkHeader {
  int32_t samples = 0;      // frames (including the 4 frames of _C's A and B vectors)
  int32_t period = 0;       // 100 ns units
  int32_t sample_bytes = 0;
  uint16_t kind = 0;        // base kind and qualifiers
  bool big_endian = true;
  bool compressed = false;  // _C
  int32_t dim = 0;          // values per frame
  int32_t frames = 0;       // data frames
  uint64_t data_offset = 12;  // first frame (after _C's vectors)
};
// Parses and checks a header against the file size. Errors: DataLoss naming `path`.
absl::StatusOr<HtkHeader> ParseHtkHeader(std::string_view bytes, const std::string& path);

// One scp line. Errors: InvalidArgument (the caller adds file and line).
struct HtkScpEntry {
  std::string key, path;
  bool has_range = false;
  int64_t first = 0, last = 0;
};
absl::StatusOr<HtkScpEntry> ParseHtkScpLine(std::string_view line, const std::string& scp_dir);

// An utterance's frames left in the file for the assembler to decode (CompressedDense,
// chunk/compressed.h), its context windows built as they are written into the batch. Decoded
// into the chunk, every value was written there and read back before the batch's copy, and a
// window's values window-fold (3.5-4.2x slower through `conveyor bench` with 11-frame windows,
// 1.7-1.8x without, bench/RESULTS.md); left in place, the file's bytes are read and the batch's
// written once. The payload's object is the file's first byte; this header
// (CompressedHeader::Load<HtkFramesPayload>()), the rest. The CUDA assembler reads it to send
// the frames as they lie and build the windows on the device (cuda/assembly_program.cc).
struct HtkFramesPayload {
  uint64_t first = 0;     // bytes from the file's first byte to the utterance's first frame
  int64_t frames = 0;     // the utterance's frames
  uint32_t dim = 0;       // values a frame
  int32_t left = 0, right = 0;  // the context window: row t is frames t - left .. t + right
  uint8_t big_endian = 1;
  uint8_t compressed = 0;  // _C: int16 values x, decoded as (x + B) / A in float; the A and B
                           // vectors (dim float32 each) 12 bytes into the file
};
// The tag of HTK's codec (registered on first use): the codec of every payload whose header
// is an HtkFramesPayload.
uint32_t HtkFramesCodecTag();

// HTKFeature: one dense stream from scp-listed HTK files (paths relative to context.base_dir).
absl::StatusOr<std::unique_ptr<Deserializer>> OpenHtkFeatureDeserializer(const DeserializerContext& context);

}  // namespace conveyor
