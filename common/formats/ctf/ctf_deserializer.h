// ctf_deserializer.h: the CNTKTextFormat deserializer: a text file indexed in one parallel
// pass (ctf_indexer.h, or loaded from the index cache) and parsed a chunk at a time
// (ctf_parser.h). Blank rows and repeated ids found by the index pass spend the error budget
// at open, like any other input error.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/formats/deserializer.h"

namespace conveyor {

// Errors: NotFound (the file), InvalidArgument (a UTF-16 file), DataLoss (index errors
// beyond maxErrors; a sequence of 4 GiB or more).
absl::StatusOr<std::unique_ptr<Deserializer>> OpenCtfDeserializer(const DeserializerContext& context);

}  // namespace conveyor
