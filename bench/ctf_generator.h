// ctf_generator.h: deterministic CTF text for benchmarks and scale tests.
#pragma once

#include <cstdint>
#include <string>

namespace conveyor::bench {

// Dense: one sample per line, `dim` floats with 6 significant digits ("|x 0.123456 ...").
std::string DenseCtf(uint64_t target_bytes, int dim = 100, uint64_t seed = 1);
// Sparse, DSSM-like: `|q` and `|d` bags of ~nnz/2 word ids below `dim` each ("|q 123:1 ...").
std::string SparseCtf(uint64_t target_bytes, int dim = 50000, int nnz = 30, uint64_t seed = 1);

}  // namespace conveyor::bench
