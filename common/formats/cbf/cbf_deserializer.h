// cbf_deserializer.h: the CNTKBinary deserializer: either CBF layout (cbf_reader.h), its
// streams checked against the configuration, the file's chunks as conveyor's chunks.
// Dense values in the dataset's precision are used where they lie in the mapping, and so are
// sparse entries (ctf2bin's layout always; the documented layout where a chunk's entries of
// an input are all in sample 0). A released chunk's pages are dropped from the mapping by the
// next parse, on a parser thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/formats/deserializer.h"

namespace conveyor {

// Errors: NotFound (the file), InvalidArgument (not a CBF file, a stream the file lacks or
// declares otherwise, another precision), DataLoss (a corrupt chunk table or chunk).
absl::StatusOr<std::unique_ptr<Deserializer>> OpenCbfDeserializer(const DeserializerContext& context);

}  // namespace conveyor
