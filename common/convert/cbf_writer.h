// cbf_writer.h: a converter, in the layer above dataset/ (it reads through a Dataset): writes
// a dataset (any format conveyor reads) as a CNTK binary file in the layout CNTK's ctf2bin.py
// writes and CNTKBinaryReader reads (formats/cbf/cbf_reader.h). What ctf2bin does, without its
// bugs: chunks of about the requested size (ctf2bin never resets its size estimate, so after
// the first chunk every sequence became its own chunk), and empty sparse samples are kept
// (ctf2bin drops them, shifting the sequence). Streams in the dataset's order under their
// input names, values in its precision, each sample's sparse entries by ascending index (as
// ctf2bin sorts them). Where ctf2bin's bugs do not bite, the output is byte-identical to its.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/dataset/dataset.h"

namespace conveyor {

struct CbfWriteOptions {
  uint64_t chunk_size = 32ull << 20;  // bytes of binary data per chunk (at least one sequence)
  // Called after each input chunk: (input chunks done, input chunks).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct CbfWriteStats {
  uint64_t sequences = 0, samples = 0, chunks = 0, bytes = 0;
};

// Writes `dataset` (in file order) to `path`, through `path`.tmp renamed at the end.
// Errors: the dataset's parse errors (beyond its maxErrors), I/O errors naming `path`.
absl::StatusOr<CbfWriteStats> WriteCbf(const Dataset& dataset, const std::string& path, const CbfWriteOptions& options);

}  // namespace conveyor
