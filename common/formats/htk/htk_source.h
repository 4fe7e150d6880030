// htk_source.h: HTK features listed in scp files and labels in MLF files, as CNTK's HTK
// deserializers read them (CNTK's "BrainScript HTKMLF Reader" page and
// Source/Readers/HTKDeserializers/ in CNTK's repository; the HTK Book for headers and MLFs).
//
// scp lines: `path`, `id=path` or `id=path[s,e]` (inclusive frames, into archives); `.../`
// at the start of a path means the scp file's directory. The key is the id (or path) without
// its last extension. HTK files: 12-byte header (nSamples, sampPeriod, sampSize, parmKind),
// big-endian (little-endian files are recognised as CNTK does: by the smaller sampPeriod);
// float32 frames, or `_C` compressed int16 frames decoded as HTK defines ((x + B) / A).
// Context windows: frames t-left..t+right concatenated, edge frames of the utterance repeated.
//
// MLF: text (`#!MLF!#`, `"key"`, `start end label ...` lines in 100 ns units, `.`), or CNTK's
// binary MLF ("MLF", version 1 or 2, run-length states). Labels map to classes through the
// state list (`labelMappingFile`), or are class numbers without one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/error_budget.h"
#include "common/formats/deserializer.h"
#include "common/log.h"

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

// MLF key as CNTK matches it: quotes, a leading "*/" and the last extension removed.
std::string MlfKey(std::string_view quoted);

struct MlfUtterance {
  std::string key;
  uint32_t frames = 0;
  std::vector<std::pair<uint32_t, uint32_t>> runs;  // (class, frames), consecutive from frame 0
};
struct MlfFile {
  std::vector<MlfUtterance> utterances;
  uint64_t dropped = 0;  // utterances with gaps or overlaps (warned)
};
// Parses a text or binary MLF. `states`: the state list (empty: labels are class numbers).
// Errors: DataLoss "PATH:LINE: ..." (text) or "PATH: byte B: ..." (binary).
absl::StatusOr<MlfFile> ParseMlf(std::string_view bytes, const std::string& path, const std::vector<std::string>& states,
                                 uint64_t frame_shift, Diagnostics* diagnostics);

// HTKFeature: one dense stream from scp-listed HTK files (paths relative to context.base_dir).
absl::StatusOr<std::unique_ptr<Deserializer>> OpenHtkFeatureDeserializer(const DeserializerContext& context);
// HTKMLF: one label stream from an MLF file.
absl::StatusOr<std::unique_ptr<Deserializer>> OpenMlfDeserializer(const DeserializerContext& context);

}  // namespace conveyor
