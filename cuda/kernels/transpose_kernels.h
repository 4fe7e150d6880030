// transpose_kernels.h: CSC -> CSR on the device, stable, as host/device bodies (grid.h), so the
// order of a row's entries is promised by construction and tested on the host: a row lists
// its entries in CSC order (by column, then as the file gave them), the CPU assembler's
// order even when a sample repeats an index. (cuSPARSE's csr2csc is documented for unique
// (row, column) pairs only.) The steps, per CSR stream (TransposeOp):
//   1. ColumnOfKernel: each CSC entry's column (binary search in colptr);
//   2. per radix digit of the row index (LSD first), a stable counting sort in tiles:
//      RadixHistogramKernel counts each tile's digits (bucket-major), an exclusive scan of
//      the counts gives each (bucket, tile)'s first place, RadixScatterKernel moves each
//      tile's entries there in order;
//   3. CsrGatherKernel: column indices and values in sorted order; CsrRowPtrKernel: rowptr
//      (binary search in the sorted rows).
// Each thread owns its tile's counters: no atomics, the same bytes for any launch shape.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/grid.h"
#include "cuda/kernels/program_ops.h"

namespace conveyor::gpu {

// The first index i in [0, n) with a[i] > v (n if none); `a` ascending.
template <typename P>
CONVEYOR_HD inline uint64_t UpperBound(const P* a, uint64_t n, int64_t v) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(a[mid]) <= v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// col_of[k]: the column of CSC entry k (the last column c with colptr[c] <= k).
struct ColumnOfKernel {
  const int32_t* colptr;  // cols + 1
  uint64_t cols, nnz;
  int32_t* col_of;

  static LaunchShape Shape(uint64_t nnz, const LaunchPolicy& p) { return ThreadPerItem(nnz, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t k = g.global_thread(); k < nnz; k += g.global_threads()) {
      col_of[k] = static_cast<int32_t>(UpperBound(colptr, cols + 1, static_cast<int64_t>(k)) - 1);
    }
  }
};

// hist[d * tiles + t]: how many keys of tile t have digit d (bits [shift, shift + 8)).
struct RadixHistogramKernel {
  const int32_t* keys;
  uint64_t nnz, tiles;
  uint32_t shift;
  uint32_t* hist;

  static LaunchShape Shape(uint64_t tiles, const LaunchPolicy& p) { return ThreadPerItem(tiles, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t t = g.global_thread(); t < tiles; t += g.global_threads()) {
      for (uint32_t d = 0; d < kRadixBuckets; ++d) hist[d * tiles + t] = 0;
      const uint64_t end = (t + 1) * kSortTile < nnz ? (t + 1) * kSortTile : nnz;
      for (uint64_t i = t * kSortTile; i < end; ++i) {
        ++hist[((static_cast<uint32_t>(keys[i]) >> shift) & (kRadixBuckets - 1)) * tiles + t];
      }
    }
  }
};

// Tile t's entries, in order, to their places: offsets[d * tiles + t] (the exclusive scan of
// hist) is where the tile's first entry of digit d goes. `perm_in` null: entry i is CSC
// entry i.
struct RadixScatterKernel {
  const int32_t* keys_in;
  const uint32_t* perm_in;
  uint64_t nnz, tiles;
  uint32_t shift;
  uint32_t* offsets;  // advanced in place: each thread owns its tile's column
  int32_t* keys_out;
  uint32_t* perm_out;

  static LaunchShape Shape(uint64_t tiles, const LaunchPolicy& p) { return ThreadPerItem(tiles, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t t = g.global_thread(); t < tiles; t += g.global_threads()) {
      const uint64_t end = (t + 1) * kSortTile < nnz ? (t + 1) * kSortTile : nnz;
      for (uint64_t i = t * kSortTile; i < end; ++i) {
        const int32_t key = keys_in[i];
        const uint32_t d = (static_cast<uint32_t>(key) >> shift) & (kRadixBuckets - 1);
        const uint32_t at = offsets[d * tiles + t]++;
        keys_out[at] = key;
        perm_out[at] = perm_in != nullptr ? perm_in[i] : static_cast<uint32_t>(i);
      }
    }
  }
};

// CSR entry i is CSC entry perm[i] (perm null: entry i): its column and value.
template <typename T>
struct CsrGatherKernel {
  const uint32_t* perm;
  const int32_t* col_of;
  const T* csc_values;
  uint64_t nnz;
  int32_t* colind;
  T* values;

  static LaunchShape Shape(uint64_t nnz, const LaunchPolicy& p) { return ThreadPerItem(nnz, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.global_thread(); i < nnz; i += g.global_threads()) {
      const uint64_t k = perm != nullptr ? perm[i] : i;
      colind[i] = col_of[k];
      values[i] = csc_values[k];
    }
  }
};

// rowptr[r] (r in [0, dim]): the number of sorted row indices below r.
struct CsrRowPtrKernel {
  const int32_t* sorted_rows;
  uint64_t nnz, dim;
  int32_t* rowptr;

  static LaunchShape Shape(uint64_t dim, const LaunchPolicy& p) { return ThreadPerItem(dim + 1, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t r = g.global_thread(); r <= dim; r += g.global_threads()) {
      rowptr[r] = static_cast<int32_t>(UpperBound(sorted_rows, nnz, static_cast<int64_t>(r) - 1));
    }
  }
};

}  // namespace conveyor::gpu
