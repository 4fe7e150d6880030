// compressed_cases.h: batches of Kaldi compressed matrices (CM, CM2, CM3) left compressed in
// a chunk, as Dataset::Open with compressed_in_place leaves them, so that an assembler's
// decode ops (the data path: DecodeOpsKernel) can be compared with the CPU assembler's
// decoding; and random such matrices covering every stored byte value.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/batch/batch_layout.h"
#include "common/chunk/parsed_chunk.h"

namespace conveyor::testing {

// A random compressed matrix object (marker, token, global header, data): `format` 1 (CM,
// sorted random column percentiles), 2 (CM2) or 3 (CM3).
std::string RandomCompressed(int format, int32_t rows, int32_t cols, std::mt19937& rng);

enum class CompressedPieces {
  kUtterances,     // each matrix one sequence, one row of the batch
  kFramesInOrder,  // every frame, in order (runs of rows: long decode ops, split in bands)
  kRandomFrames,   // frames picked at random (short runs; CM runs under 4 rows decode on the host)
};

struct CompressedCase {
  std::vector<std::unique_ptr<std::string>> objects;  // the chunk points into these
  std::unique_ptr<ParsedChunk> chunk;
  std::vector<StreamConfig> streams;
  BatchShape shape;
  std::vector<PieceRef> pieces;
};

// One dense stream of `cols` columns: each of `objects` a sequence, its window the rows from
// `row0` and the columns [col0, col0 + cols) (as an scp range gives). Every object has more
// than row0 rows and at least col0 + cols columns.
CompressedCase MakeCompressedCase(std::vector<std::string> objects, int64_t row0, int64_t col0, uint32_t cols,
                                  CompressedPieces pieces, uint64_t seed);

}  // namespace conveyor::testing
