// keyed_labels.h: the example format of docs/adding-a-format.md, compiled and tested here:
// "KeyedLabels", a text file of one sequence a line, `key class class ...`, read as one
// `ids` or one-hot `sparse` stream with a sample per class. Being keyed, it joins any other
// deserializer of a composite by key (a CTF file's sequence ids, a Kaldi table's keys).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/formats/deserializer.h"

namespace conveyor::example {

// Errors: NotFound (the file); InvalidArgument (not exactly one input); DataLoss for a line
// without a key, a class that is no number or lies outside [0, dim), beyond maxErrors (within
// it, the line is skipped with a warning).
absl::StatusOr<std::unique_ptr<Deserializer>> OpenKeyedLabels(const DeserializerContext& context);

}  // namespace conveyor::example
