// gen_ctf: writes a large CTF file for `conveyor bench` and scale tests.
//   gen_ctf dense|sparse BYTES OUT.ctf
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/ctf_generator.h"

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "dense") != 0 && std::strcmp(argv[1], "sparse") != 0)) {
    std::fprintf(stderr, "usage: gen_ctf dense|sparse BYTES OUT.ctf\n"
                         "  dense:  |x <100 floats> |y 1        (one sample per line)\n"
                         "  sparse: |q <15 id:1> |d <15 id:1>   (dim 50000, DSSM-like)\n");
    return 2;
  }
  const uint64_t bytes = std::strtoull(argv[2], nullptr, 10);
  const std::string data = std::strcmp(argv[1], "dense") == 0 ? conveyor::bench::DenseCtf(bytes)
                                                               : conveyor::bench::SparseCtf(bytes);
  FILE* f = std::fopen(argv[3], "wb");
  if (f == nullptr || std::fwrite(data.data(), 1, data.size(), f) != data.size() || std::fclose(f) != 0) {
    std::perror(argv[3]);
    return 1;
  }
  return 0;
}
