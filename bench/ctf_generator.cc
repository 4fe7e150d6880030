#include "bench/ctf_generator.h"

#include <cstdio>
#include <random>

namespace conveyor::bench {

std::string DenseCtf(uint64_t target_bytes, int dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::string out;
  out.reserve(target_bytes + 4096);
  char buf[32];
  while (out.size() < target_bytes) {
    out += "|x";
    for (int j = 0; j < dim; ++j) {
      int n = std::snprintf(buf, sizeof(buf), " %.6g", u(rng));
      out.append(buf, n);
    }
    out += " |y 1\n";
  }
  return out;
}

std::string SparseCtf(uint64_t target_bytes, int dim, int nnz, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> word(0, dim - 1);
  std::string out;
  out.reserve(target_bytes + 4096);
  char buf[32];
  while (out.size() < target_bytes) {
    for (const char* stream : {"|q", " |d"}) {
      out += stream;
      for (int j = 0; j < nnz / 2; ++j) {
        int n = std::snprintf(buf, sizeof(buf), " %d:1", word(rng));
        out.append(buf, n);
      }
    }
    out += '\n';
  }
  return out;
}

}  // namespace conveyor::bench
