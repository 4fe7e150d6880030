// file_source.h: a CNTKTextFormat or CNTKBinary file as one deserializer of a composite
// dataset. Such files are read chunk by chunk on their own; in a composite, their sequences
// are joined by key with the other deserializers' (the first deserializer's order), so
// the file is opened as a dataset of its own and served sequence by sequence. Its keys
// are its sequence ids as decimal text (CTF: the id written at the start of each line, or
// the line number without ids; CBF: the sequence's index in the file), which is what a
// Kaldi or HTK key of the same sequence must read.
//
// Opening parses the whole file once (every chunk, then dropped) to learn each sequence's
// sample count per stream, which joining and chunking need; a sequence the parser drops as
// bad (within maxErrors) is not offered. Decode then copies a sequence out of its parsed
// chunk; the last few parsed chunks are kept, so reading in the file's own order (the file
// as the primary deserializer, or joined in the same order) parses every chunk once more.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/formats/keyed_source.h"

namespace conveyor {

struct DatasetOpenOptions;

// `parent`: the composite's configuration (precision, maxErrors, frame mode...); `d`: the
// CNTKTextFormat or CNTKBinary deserializer in it. Errors: those of opening and parsing
// the file on its own (NotFound, InvalidArgument, DataLoss).
absl::StatusOr<std::unique_ptr<KeyedSource>> OpenFileSource(const DatasetConfig& parent, const DeserializerConfig& d,
                                                            const DatasetOpenOptions& options);

}  // namespace conveyor
