// assembly_kernels.h: the bodies of the CUDA assembler's kernels (assembly_program.h), written
// once as host/device code of their grid coordinates (grid.h). The device launches them
// through device_launch.cuh, the host tests through host_executor.h; both with the launch
// shapes below. Each reads its descriptors from the staging buffer, as they were sent.
//
// Compile without floating-point contraction (device --fmad=false, host -ffp-contract=off):
// DecodeOpsKernel's values are then Kaldi's bit for bit (kaldi_cm_math.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/formats/kaldi/kaldi_cm_math.h"
#include "cuda/kernels/grid.h"
#include "cuda/kernels/program_ops.h"

namespace conveyor::gpu {

// Little-endian uint16 at any address (staged Kaldi data is byte-packed).
CONVEYOR_HD inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
// Either byte order (staged HTK _C values are the file's bytes).
CONVEYOR_HD inline uint16_t LoadU16(const uint8_t* p, bool big_endian) {
  return big_endian ? static_cast<uint16_t>(p[1] | (p[0] << 8)) : LoadU16(p);
}

// One block per copy item (grid-stride over items), threads over its bytes: 16-byte moves
// when both ends and the length allow, else 4-byte, else bytes (alignment from the actual
// addresses).
struct CopyItemsKernel {
  const CopyItem* items;
  uint64_t n;
  const std::byte* staging;
  std::byte* slot;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return BlockPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.block; i < n; i += g.grid_dim) {
      const CopyItem it = items[i];
      const std::byte* src = staging + it.src;
      std::byte* dst = slot + it.dst;
      const uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | it.bytes;
      if ((bits & 15) == 0) {
        const auto* s = reinterpret_cast<const Bytes16*>(src);
        auto* d = reinterpret_cast<Bytes16*>(dst);
        for (uint64_t k = g.thread; k < it.bytes / 16; k += g.block_dim) d[k] = s[k];
      } else if ((bits & 3) == 0) {
        const auto* s = reinterpret_cast<const uint32_t*>(src);
        auto* d = reinterpret_cast<uint32_t*>(dst);
        for (uint64_t k = g.thread; k < it.bytes / 4; k += g.block_dim) d[k] = s[k];
      } else {
        for (uint64_t k = g.thread; k < it.bytes; k += g.block_dim) dst[k] = src[k];
      }
    }
  }
};

// One block per CSC piece op: its row indices and values go to colptr[first_col] + skip
// (colptr already scanned) of the stream's arrays.
template <typename T>
struct CscPiecesKernel {
  const CscPieceOp* ops;
  uint64_t n;
  const std::byte* staging;
  std::byte* slot;
  std::byte* scratch;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return BlockPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.block; i < n; i += g.grid_dim) {
      const CscPieceOp op = ops[i];
      std::byte* base = op.in_scratch ? scratch : slot;
      const uint64_t first =
          op.wide ? static_cast<uint64_t>(reinterpret_cast<const int64_t*>(base + op.colptr)[op.first_col])
                  : static_cast<uint64_t>(reinterpret_cast<const int32_t*>(base + op.colptr)[op.first_col]);
      const uint64_t at = first + op.skip;
      const auto* src_rowind = reinterpret_cast<const int32_t*>(staging + op.src_rowind);
      const auto* src_values = reinterpret_cast<const T*>(staging + op.src_values);
      auto* rowind = reinterpret_cast<int32_t*>(base + op.rowind) + at;
      T* values = reinterpret_cast<T*>(base + op.values) + at;
      for (uint64_t k = g.thread; k < op.nnz; k += g.block_dim) {
        rowind[k] = src_rowind[k];
        values[k] = src_values[k];
      }
    }
  }
};

// One thread per scatter op (a sparse sample delivered dense, or one row band of it): its
// entries added in file order into its zeroed dense column. No two threads add to the same
// value (distinct columns, or distinct bands of one), so no atomics, and the sums are the
// CPU's.
template <typename T>
struct ScatterKernel {
  const ScatterOp* ops;
  uint64_t n;
  const std::byte* staging;
  std::byte* slot;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return ThreadPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.global_thread(); i < n; i += g.global_threads()) {
      const ScatterOp op = ops[i];
      const auto* rowind = reinterpret_cast<const int32_t*>(staging + op.src_rowind);
      const auto* values = reinterpret_cast<const T*>(staging + op.src_values);
      T* column = reinterpret_cast<T*>(slot + op.dst);
      for (uint64_t k = 0; k < op.nnz; ++k) {
        const auto row = static_cast<uint32_t>(rowind[k]);
        if (op.bands == 1 || row % op.bands == op.band) column[row] += values[k];
      }
    }
  }
};

// One block per decode op, one thread per value (row-major). CM values recompute their
// column's percentiles (cheap next to the memory traffic).
template <typename T>
struct DecodeOpsKernel {
  const DecodeOp* ops;
  uint64_t n;
  const uint8_t* staging;
  std::byte* slot;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return BlockPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.block; i < n; i += g.grid_dim) {
      const DecodeOp op = ops[i];
      const uint8_t* src = staging + op.src;
      T* out = reinterpret_cast<T*>(slot + op.dst);
      const uint64_t count = uint64_t{op.rows} * op.cols;
      const float inc = op.type == 2 ? kaldi::Cm2Increment(op.range) : kaldi::Cm3Increment(op.range);
      for (uint64_t k = g.thread; k < count; k += g.block_dim) {
        const uint64_t r = k / op.cols, c = k % op.cols;
        float v;
        if (op.type == 1) {
          const uint8_t* h = src + 8 * c;
          const float p0 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h));
          const float p25 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 2));
          const float p75 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 4));
          const float p100 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 6));
          v = kaldi::CmByte(p0, p25, p75, p100, src[8 * uint64_t{op.cols} + c * op.column_rows + op.row0 + r]);
        } else if (op.type == 2) {
          v = kaldi::CmLinear(op.min_value, inc, LoadU16(src + 2 * k));
        } else {
          v = kaldi::CmLinear(op.min_value, inc, src[k]);
        }
        out[k] = static_cast<T>(v);
      }
    }
  }
};

// Bits of a float, and back.
CONVEYOR_HD inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
CONVEYOR_HD inline float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
CONVEYOR_HD inline bool IsNanBits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Where IEEE 754 leaves a NaN's bits open, the answers of the CPU decoder, so that a file's
// NaNs reach a batch with the same bits whichever assembler wrote it: an operation on a NaN
// gives its first NaN operand, quieted; an invalid one on numbers (0/0, inf/inf) the host's
// "default NaN", `default_nan` (x86: 0xffc00000, Arm: 0x7fc00000; HostDefaultNan()); float
// to double keeps a NaN's sign and payload, quieted. (x86 and Arm hardware do this; CUDA
// gives its canonical NaN 0x7fffffff in all three.) HTK _C: (x + b) / a in float.
CONVEYOR_HD inline float HtkCompressedValue(int16_t x, float a, float b, uint32_t default_nan) {
  const uint32_t ua = FloatBits(a), ub = FloatBits(b);
  const float q = IsNanBits(ub) ? BitsFloat(ub | 0x00400000u) : static_cast<float>(x) + b;
  if (IsNanBits(FloatBits(q))) return q;
  if (IsNanBits(ua)) return BitsFloat(ua | 0x00400000u);
  const float v = q / a;
  return IsNanBits(FloatBits(v)) ? BitsFloat(default_nan) : v;
}
// The host's default NaN: what 0/0 gives here (host code only).
inline uint32_t HostDefaultNan() {
  volatile float zero = 0.0f;
  return FloatBits(zero / zero);
}
template <typename T>
CONVEYOR_HD inline T WidenFloat(float v) {
  if constexpr (sizeof(T) == 8) {
    const uint32_t u = FloatBits(v);
    if (IsNanBits(u)) {
      const uint64_t bits = (uint64_t{u >> 31} << 63) | 0x7ff8000000000000ull | (uint64_t{u & 0x7fffffu} << 29);
      T d;
      memcpy(&d, &bits, 8);
      return d;
    }
  }
  return static_cast<T>(v);
}

// A 32-bit value at any address (staged HTK frames are the file's bytes), byte-swapped when
// big-endian.
CONVEYOR_HD inline uint32_t LoadU32(const uint8_t* p, bool big_endian) {
  const uint32_t b0 = p[0], b1 = p[1], b2 = p[2], b3 = p[3];
  return big_endian ? (b0 << 24 | b1 << 16 | b2 << 8 | b3) : (b3 << 24 | b2 << 16 | b1 << 8 | b0);
}
CONVEYOR_HD inline float LoadF32(const uint8_t* p, bool big_endian) { return BitsFloat(LoadU32(p, big_endian)); }

// One block per frames op, one thread per value (row-major): HTK context windows built from
// frames staged once (FramesOp), bit for bit the CPU assembler's values (htk_features.cc).
template <typename T>
struct FramesKernel {
  const FramesOp* ops;
  uint64_t n;
  const uint8_t* staging;
  std::byte* slot;

  static LaunchShape Shape(uint64_t n, const LaunchPolicy& p) { return BlockPerItem(n, p); }

  CONVEYOR_HD void operator()(const Grid& g) const {
    for (uint64_t i = g.block; i < n; i += g.grid_dim) {
      const FramesOp op = ops[i];
      const uint8_t* src = staging + op.src;
      const bool be = op.big_endian != 0;
      T* out = reinterpret_cast<T*>(slot + op.dst);
      const uint64_t count = uint64_t{op.rows} * op.cols;
      for (uint64_t k = g.thread; k < count; k += g.block_dim) {
        const uint64_t r = k / op.cols, c = op.col0 + k % op.cols;
        int64_t f = op.base + static_cast<int64_t>(r + c / op.dim);
        f = f < 0 ? 0 : (f > op.last ? op.last : f);
        const uint64_t at = static_cast<uint64_t>(f - op.first) * op.dim + c % op.dim;
        float v;
        if (op.compressed != 0) {
          const float a = LoadF32(staging + op.scale + 4 * (c % op.dim), be);
          const float b = LoadF32(staging + op.scale + 4 * (op.dim + c % op.dim), be);
          v = HtkCompressedValue(static_cast<int16_t>(LoadU16(src + 2 * at, be)), a, b, op.default_nan);
        } else {
          v = LoadF32(src + 4 * at, be);  // (moved, not computed: a NaN keeps its bits)
        }
        out[k] = WidenFloat<T>(v);
      }
    }
  }
};

}  // namespace conveyor::gpu
