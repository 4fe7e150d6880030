// mlf.h: labels in MLF files, as CNTK's HTKMLFDeserializer reads them (CNTK's "BrainScript
// HTKMLF Reader" page and Source/Readers/HTKDeserializers/ in CNTK's repository; the HTK
// Book for MLFs).
//
// MLF: text (`#!MLF!#`, `"key"`, `start end label ...` lines in 100 ns units, `.`), or CNTK's
// binary MLF ("MLF", version 1 or 2, run-length states). Labels map to classes through the
// state list (`labelMappingFile`), or are class numbers without one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/deserializer.h"
#include "common/log.h"

namespace conveyor {

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

// HTKMLF: one label stream from an MLF file.
absl::StatusOr<std::unique_ptr<Deserializer>> OpenMlfDeserializer(const DeserializerContext& context);

}  // namespace conveyor
