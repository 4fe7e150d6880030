// kaldi_object.h: one Kaldi object as Kaldi's table holders write it ("Kaldi I/O
// mechanisms"; tests/data/kaldi): binary (`\0B` marker) or text; float/double matrices
// (FM, DM) and vectors (FV, DV); compressed matrices (CM, CM2, CM3); int32 vectors
// (alignments, every element with its own size byte). Scanning checks every length against
// the bytes available and parses text completely, so that decoding a scanned object cannot
// fail. Decoding of compressed matrices is bit-exact with Kaldi's (float arithmetic in
// Kaldi's order; this file is compiled without FMA contraction).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/compressed.h"

namespace conveyor::kaldi {

enum class ObjectType : uint8_t {
  kFloatMatrix,   // binary FM
  kDoubleMatrix,  // binary DM
  kCompressed1,   // binary CM: 1 byte a value, per-column headers, column-major
  kCompressed2,   // binary CM2: uint16 row-major
  kCompressed3,   // binary CM3: uint8 row-major
  kTextMatrix,    // " [ ... ]"
  kFloatVector,   // binary FV
  kDoubleVector,  // binary DV
  kTextVector,    // " [ ... ]" with one row
  kInt32Vector,   // binary: 04 n, then n x (04 value)
  kTextInt32Vector,  // "v1 v2 ... vn \n"
};
const char* ObjectTypeName(ObjectType t);

// What a table holds: which objects are acceptable (as Kaldi's holders decide).
enum class ObjectKind { kMatrix, kVector, kInt32Vector };

struct ObjectInfo {
  ObjectType type = ObjectType::kFloatMatrix;
  uint64_t size = 0;  // bytes from the object's first byte through its end (text: the newline)
  int64_t rows = 0;   // vectors: 1 (0 when empty)
  int64_t cols = 0;   // vectors: their length
  // Compressed: the stored header (for decoding); empty CM with Kaldi's 4 leftover bytes
  // (see ScanObject) counts them in `size`.
  float min_value = 0, range = 0;
};

// A row/column window of a matrix, both ends inclusive, already checked against its shape.
struct Window {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// Scans the object starting at `bytes[pos]` (for a text object, `pos` may point at the
// whitespace before it). Errors: DataLoss "byte B: expected ..." (B absolute in `bytes`);
// the caller adds the file name and key.
absl::StatusOr<ObjectInfo> ScanObject(std::string_view bytes, uint64_t pos, ObjectKind kind);

// Decodes `window` of the scanned matrix or vector at `pos` (vectors: row 0) into `out`,
// row-major, window.rows * window.cols values. Float readers get DM values as (float)d and
// text parsed with strtof rules; double readers get float values widened and text parsed as
// double (Kaldi's cross-type reading, README 4.8).
template <typename T>
void DecodeMatrix(std::string_view bytes, uint64_t pos, const ObjectInfo& info, const Window& window, T* out);

// Where `window`'s values lie in `bytes`, when decoding them would only copy them: a binary
// FM/FV (`double_values` false) or DM/DV (true) whose window spans whole rows (row-major,
// contiguous, little endian as stored; any alignment). Null otherwise (text, compressed,
// another precision, a column range).
const char* ContiguousValues(std::string_view bytes, uint64_t pos, const ObjectInfo& info, const Window& window,
                             bool double_values);

// Decodes a scanned int32 vector.
void DecodeInt32Vector(std::string_view bytes, uint64_t pos, const ObjectInfo& info, std::vector<int32_t>* out);

// The compressed-matrix codec (CM, CM2, CM3) of parsed chunks (chunk/compressed.h):
// registered on first use, and the tag every Kaldi compressed payload carries.
uint32_t CompressedCodecTag();
// A scanned compressed matrix's header as a payload's header (the codec's tag and `info`),
// and back (CompressedObjectInfo: for the CUDA assembler, which decodes on the device).
CompressedHeader ToCompressedHeader(const ObjectInfo& info);
ObjectInfo CompressedObjectInfo(const CompressedHeader& header);

// Kaldi's exact decode of one CM byte given the column's four percentiles, and of a stored
// uint16 percentile (exposed for tests).
float CompressedByteToFloat(float p0, float p25, float p75, float p100, uint8_t v);
float CompressedPercentileToFloat(float min_value, float range, uint16_t v);

}  // namespace conveyor::kaldi
