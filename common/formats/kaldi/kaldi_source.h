// kaldi_source.h: a KaldiTable deserializer (docs/design.md section 3): one stream from a Kaldi
// table. `kind: matrix` gives a sample per row (dim = columns), `kind: vector` one sample per
// entry (dim = length), `kind: int32-vector` a sample per element, delivered as `ids` or as
// one-hot `sparse` with dim classes.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/error_budget.h"
#include "common/formats/kaldi/kaldi_table.h"
#include "common/formats/deserializer.h"
#include "common/log.h"

namespace conveyor {

// Errors: as KaldiTable::Open; InvalidArgument for an entry whose dim differs from the
// configured (or first) one, or a label outside [0, dim) for one-hot labels, unless maxErrors
// lets it be skipped.
// Pipes are allowed by the node's allowPipes, else the dataset's.
absl::StatusOr<std::unique_ptr<Deserializer>> OpenKaldiDeserializer(const DeserializerContext& context);

}  // namespace conveyor
