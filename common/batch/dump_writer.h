// dump_writer.h: the dump format of docs/design.md section 5, JSON Lines, one object per
// sequence in delivery order, read back out of an assembled batch (so that a dump checks
// the batch layout, not the parser's columns):
//   {"epoch":0,"batch":0,"key":"100","streams":{"a":{"dense":[[1,2,3]]},"b":{"sparse":[[[3,1.5]]]}}}
// A sparse stream delivered as CSR prints each sample's entries in ascending index order;
// one delivered as dense prints as a dense stream.
// floats print with %.9g, doubles with %.17g; non-finite values as Infinity/-Infinity/NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "common/batch/batch_layout.h"

namespace conveyor {

// Appends the lines of one batch to `out`: one per piece, in row order. `bytes` is the
// batch as `plan` lays it out. A frame of a multi-sample sequence has key "KEY/FRAME";
// truncated BPTT lines carry "slot" (row) and "offset" (first sample of the piece).
// A non-empty `cursor` is added as "cursor" to the batch's last line; a batch with no
// piece (an empty local minibatch) then prints {"epoch":E,"batch":B,"empty":true,"cursor":...}.
void AppendDump(uint64_t epoch, uint64_t batch, const BatchPlan& plan,
                absl::Span<const std::byte> bytes, const std::string& cursor, std::string* out);

// Appends the bytes `s` escaped for the inside of a JSON string, as valid UTF-8: `"`, `\`
// and control characters as JSON escapes them; valid UTF-8 sequences unchanged; every byte
// that is not part of one (keys are bytes: a Kaldi or HTK utterance id need not be UTF-8)
// as \udcXX, the code point Python's surrogateescape gives it (PEP 383), so that
// json.loads(x).encode("utf-8", "surrogateescape") is the bytes again.
void AppendJsonStringBody(const std::string& s, std::string* out);
// Appends `v` as the dump prints it.
void AppendNumber(float v, std::string* out);
void AppendNumber(double v, std::string* out);

}  // namespace conveyor
