// stream_types.h: what kind of values a stream holds and in which precision: the two
// enumerations the configuration, the batch layout and the clients share.
#pragma once

namespace conveyor {

enum class StreamFormat { kDense, kSparse, kIds };
enum class Precision { kFloat, kDouble };

// "dense", "sparse" or "ids".
const char* StreamFormatName(StreamFormat f);

}  // namespace conveyor
