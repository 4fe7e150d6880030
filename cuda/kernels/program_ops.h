// program_ops.h: the descriptors of an assembly program (assembly_program.h) that the
// kernels read from the staging buffer, and the bounds that split long work into several
// descriptors so that many blocks share it. Plain structs; no CUDA, no absl.
#pragma once

#include <cstdint>

namespace conveyor::gpu {

// Largest copy one thread block does; longer segments are split.
inline constexpr uint64_t kCopyItemBytes = 64 << 10;
// Most entries one CSC piece op moves; a longer piece becomes several ops (one block each).
inline constexpr uint64_t kCscPieceEntries = 8192;
// Most values one decode op writes; a longer run of rows becomes several ops.
inline constexpr uint64_t kDecodeOpValues = 16384;
// A sparse sample delivered dense with more entries than this is split into row bands (at
// most kMaxScatterBands), each summed by its own thread.
inline constexpr uint64_t kScatterBandEntries = 64;
inline constexpr uint32_t kMaxScatterBands = 16;
// The CSR transpose's stable radix sort: digits of kRadixBits, tiles of kSortTile entries
// (one thread each).
inline constexpr uint32_t kRadixBits = 8;
inline constexpr uint32_t kRadixBuckets = 1u << kRadixBits;
inline constexpr uint64_t kSortTile = 128;

// Byte offsets; `src` into the staging buffer, `dst` into the slot.
struct CopyItem {
  uint64_t src = 0, dst = 0, bytes = 0;
};

// A CSC stream's colptr: exclusive scan of `cols + 1` counts (the last one 0) at staging
// offset `counts`, of the colptr's own type (int64 when `wide`, else int32).
struct ScanOp {
  uint64_t counts = 0, cols = 0;
  uint64_t colptr = 0;  // destination offset (slot, or scratch when in_scratch)
  uint32_t wide = 0, in_scratch = 0;
};

// Entries [skip, skip + nnz) of one piece of a CSC stream: row indices and values, staged at
// src_rowind/src_values (the piece's entry `skip` first), land at position
// colptr[first_col] + skip of the stream's rowind/values arrays.
struct CscPieceOp {
  uint64_t src_rowind = 0, src_values = 0, nnz = 0, first_col = 0, skip = 0;
  uint64_t colptr = 0, rowind = 0, values = 0;  // the stream's arrays (slot, or scratch)
  uint32_t wide = 0, in_scratch = 0;
};

// One sparse sample delivered dense: its entries summed, in order, into the zeroed dense
// column at slot offset `dst` (dim values). Split in `bands` ops, the op of band b adds only
// the entries whose row % bands == b (each row's sum stays in file order).
struct ScatterOp {
  uint64_t src_rowind = 0, src_values = 0, nnz = 0, dst = 0;
  uint32_t band = 0, bands = 1;
};

// A CSR stream: the CSC in scratch (int32 colptr, cols x dim) transposed into the slot by a
// stable radix sort of its row indices (`passes` digits), so that a row's entries keep the
// CSC order (column, then file order), as the CPU assembler's counting sort does. Scratch
// arrays of nnz entries: col_of (each entry's column), keys[2]/perm[2] (ping-pong: sorted
// row indices, their CSC positions); of kRadixBuckets x tiles: hist, offsets.
struct TransposeOp {
  uint64_t cols = 0, dim = 0, nnz = 0;
  uint64_t csc_colptr = 0, csc_rowind = 0, csc_values = 0;  // scratch offsets
  uint64_t rowptr = 0, colind = 0, values = 0;              // slot offsets
  uint64_t col_of = 0, keys[2] = {0, 0}, perm[2] = {0, 0}, hist = 0, offsets = 0;  // scratch
  uint64_t tiles = 0;
  uint32_t passes = 0;
};

// Rows [row0, row0 + rows) of a dense piece left compressed (Kaldi CM, CM2, CM3), `cols`
// values a row, decoded into the slot at `dst`, row-major. Staged at `src`: CM2 and CM3 the
// rows' stored values, row-major (2 or 1 bytes each; row0 is then 0, the rows start at src);
// CM the window's column headers (8 bytes each), then its bytes column by column
// (`column_rows` a column, of which this op decodes rows row0...). Decoded with Kaldi's
// arithmetic (kaldi_cm_math.h), so the values are the CPU decoder's bit for bit.
struct DecodeOp {
  uint64_t src = 0, dst = 0;
  uint32_t type = 0;  // 1: CM, 2: CM2, 3: CM3
  uint32_t rows = 0, cols = 0;
  uint32_t row0 = 0, column_rows = 0;
  float min_value = 0, range = 0;
};

// Rows [0, rows) of an HTK utterance's context windows (columns col0 .. col0 + cols of each),
// decoded into the slot at `dst`, row-major: row r, column c is value c % dim of utterance
// frame clamp(base + r + c / dim, 0, last) (the edge frames repeated), which lies at staged
// frame (that frame - first) from `src`, dim values of 4 bytes (float32) or, `compressed`
// (_C), 2 (int16 x, decoded as (x + B[j]) / A[j] in float, the A and B vectors staged at
// `scale`), big- or little-endian as stored. The frames are staged as they lie in the file,
// once each, so a window of w frames sends 1/w of the bytes its rows hold. `default_nan`: what
// the host gives for 0/0 (HtkCompressedValue).
struct FramesOp {
  uint64_t src = 0, scale = 0, dst = 0;
  int64_t base = 0, first = 0, last = 0;
  uint32_t rows = 0, cols = 0, col0 = 0, dim = 0;
  uint32_t big_endian = 0, compressed = 0, default_nan = 0, unused = 0;
};

}  // namespace conveyor::gpu
