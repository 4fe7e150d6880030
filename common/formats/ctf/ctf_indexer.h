// ctf_indexer.h: one pass over a CNTK Text Format file that finds its sequences (CNTK's
// TextInputIndexBuilder rules, Source/Readers/ReaderLib/IndexBuilder.cpp in CNTK's repository):
//  - per-line mode when skipSequenceIds is set or the first non-space character of the file
//    is '|': every line is a one-row sequence keyed by its 0-based line number;
//  - otherwise a line starts a new sequence when it begins with a numeric id different from
//    the current sequence's id; lines without id continue the current sequence.
// With a definesMBSize stream, sample counts are the rows that carry that stream (per-line
// mode skips rows without it). Blank rows are input errors (counted in Index::errors),
// except trailing ones at the end of the file. The pass runs in parallel over byte ranges
// and gives the same index for any thread count.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/index/index.h"

namespace conveyor {

struct CtfIndexOptions {
  bool skip_sequence_ids = false;
  std::string main_alias;  // alias of the definesMBSize stream; empty when none
  uint64_t chunk_size = 32ull << 20;
  int threads = 0;  // 0: hardware concurrency
  // Called from worker threads with the number of bytes scanned so far (monotonic).
  std::function<void(uint64_t)> progress;
  // When set, each thread reads its range with it, a window of `read_window` bytes at a
  // time (more for a longer line), instead of through `bytes`, which is then touched only
  // at a few places (the first bytes, the ranges' bounds, line estimates, and a line too
  // long for kMaxReadWindow). MappedFile::Read: on the virtual machines of bench/RESULTS.md
  // the first touch of each mapped page cost 3-4x the kernel's copy, and the scan reads
  // every page once ("`conveyor index` read, not mapped"). An error it returns ends the
  // index, returned as it is (MappedFile::Read names the file and the byte range). Each
  // thread's buffer grows to the longest line it read, kMaxReadWindow at most.
  std::function<absl::Status(uint64_t offset, uint64_t length, char* out)> read;
  uint64_t read_window = uint64_t{512} << 10;
  static constexpr uint64_t kMaxReadWindow = uint64_t{64} << 20;
};

// Indexes `bytes` (the whole file); `path` names it in messages. Does not apply the error
// budget: the caller decides what Index::errors means. Errors: InvalidArgument for a UTF-16
// file; DataLoss for a sequence of 4 GiB or more or an id longer than 19 digits.
absl::StatusOr<Index> BuildCtfIndex(std::string_view bytes, const std::string& path,
                                    const CtfIndexOptions& options);

// The configuration hash that keys the index cache of a CTF file.
uint64_t CtfIndexConfigHash(const CtfIndexOptions& options);

}  // namespace conveyor
