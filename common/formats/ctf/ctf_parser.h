// ctf_parser.h: parses the sequences of one chunk of a CNTK Text Format file into a
// ParsedChunk (the grammar of CNTK's "BrainScript CNTK Text Format Reader" page; CNTK's
// TextParser where the page is silent):
//   row      := [digits] (delimiter | '|' name values | '|#' comment)* '\n'
//   delimiter: space, tab, and control characters other than '\n' (so '\r' too)
//   dense    := real*          (fewer than dim values: zero-padded, with a warning)
//   sparse   := (index ':' real)*   index < dim, kept in file order
//   real     := [+-]digits['.'digits][(e|E)[+-]digits]   (correctly rounded: plain decimals
//               by inline fast paths, ctf_number.h's SSE2 ones first, the rest by fast_float)
//   comment  : runs to the end of the line or the next '|' ('|#' inside it is an
//              escaped pipe, which starts another comment and so changes nothing)
// Unknown input names are skipped. A bad sequence (bad number, index out of range, too
// many dense values, an input twice on a row, a row without any configured input, more
// rows than its longest input has samples) spends one unit of the ErrorBudget and is
// dropped whole; past the budget, ParseChunk fails with that error. Error texts read
// "FILE:LINE:COLUMN: what was expected". Does not throw; allocates the chunk's buffers.
#pragma once

#include <memory>
#include <string>
#include <atomic>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/error_budget.h"
#include "common/index/index.h"
#include "common/log.h"

namespace conveyor {

struct CtfParserOptions {
  std::string path;                   // for messages
  std::vector<StreamConfig> streams;  // the deserializer's streams, in output order
  Precision precision = Precision::kFloat;
};

// Immutable after construction; ParseChunk is thread-safe (the budget and diagnostics are).
class CtfParser {
 public:
  // `diagnostics` and `budget` must outlive the parser.
  CtfParser(CtfParserOptions options, Diagnostics* diagnostics, ErrorBudget* budget);

  // Parses chunk `chunk_id` of `index` from `file` (the whole mapped file).
  // Errors: DataLoss "FILE:LINE:COL: ..." once the error budget is exceeded.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(std::string_view file, const Index& index,
                                                          uint64_t chunk_id) const {
    return ParseChunk(file, 0, index, chunk_id);
  }
  // The same from `bytes`, the file's bytes from offset `base` on (at least the chunk's:
  // [begin_offset, end_offset) as read). The result is the same, error texts included; a
  // sequence outside those bytes (an index that does not match them) is an Internal error.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(std::string_view bytes, uint64_t base, const Index& index,
                                                          uint64_t chunk_id) const;

  // Parses one sequence given by its entry (used by tests and fuzzers). Same errors.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseSequences(
      std::string_view file, const HugeVector<SequenceEntry>& sequences) const;

 private:
  const CtfParserOptions options_;
  Diagnostics* const diagnostics_;
  ErrorBudget* const budget_;
  int main_stream_ = -1;  // the definesMBSize stream, if any
  // Per stream, the most sparse entries per 64 KiB of chunk bytes seen so far (0: none
  // parsed yet): a chunk's vectors are reserved from it, so that they are neither grown by
  // doubling (each growth faults in fresh pages and copies) nor held far larger than used
  // (a chunk's capacity counts against the chunk cache).
  mutable std::vector<std::atomic<uint64_t>> entries_per_64k_;
};

}  // namespace conveyor
