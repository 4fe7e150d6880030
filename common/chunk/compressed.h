// compressed.h: dense values a parsed chunk leaves compressed for the assembler to decode
// (ParsedStream::compressed), and the registry of their codecs. The chunk layer knows no
// format: a payload carries the tag of its codec and the codec's own header as opaque
// bytes; the format that owns the encoding (Kaldi: CM, CM2, CM3; HTK: frames, big-endian
// or _C, and their context windows) registers the decoder and fills the header. The CUDA
// assembler decodes Kaldi's payloads on the device, reading the header through Kaldi's own
// accessor, and any other codec's on the host as the CPU assembler does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace conveyor {

// What the format that scanned a payload needs to decode it.
struct CompressedHeader {
  static constexpr size_t kBytes = 40;

  CompressedHeader() = default;
  // A format's scanned header converts implicitly where the format defines
  // `CompressedHeader ToCompressedHeader(const ItsHeader&)` (found by argument-dependent lookup).
  template <typename H, typename = decltype(ToCompressedHeader(std::declval<const H&>()))>
  CompressedHeader(const H& h) : CompressedHeader(ToCompressedHeader(h)) {}  // NOLINT(runtime/explicit)

  uint32_t codec = 0;  // RegisterCompressedCodec's tag; 0: none
  alignas(8) unsigned char bytes[kBytes] = {};  // the codec's own header, opaque here

  // Stores / loads a trivially copyable header of the codec's own type in `bytes`.
  template <typename T>
  void Store(const T& value) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kBytes);
    std::memcpy(bytes, &value, sizeof(T));
  }
  template <typename T>
  T Load() const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kBytes);
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }
};

// A dense sequence left compressed for the assembler to decode: the CUDA assembler sends the
// compressed bytes and decodes on the device; the CPU assembler decodes as it copies. Its
// samples are the window's rows from `row0` on, its values the `dim` columns from `col0` on.
struct CompressedDense {
  const char* object = nullptr;  // the payload's first byte, in the mapped input
  CompressedHeader info;         // its codec and the codec's header, as scanned
  int64_t row0 = 0, col0 = 0;
};

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a payload, already checked
// against its shape by the format that scanned it.
struct CompressedWindow {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// A codec's decoders: `window` of the payload at `object` into `out`, row-major
// (window.rows * window.cols values). Must not fail (the payload was checked when scanned).
struct CompressedCodec {
  const char* name = nullptr;
  void (*decode_f32)(const char* object, const CompressedHeader& header, const CompressedWindow& window, float* out) = nullptr;
  void (*decode_f64)(const char* object, const CompressedHeader& header, const CompressedWindow& window, double* out) = nullptr;
};

// Registers `codec` and returns its tag (at least 1). Thread-safe; a format registers its
// codec once (e.g. from a function-local static), at most 15 codecs in all.
uint32_t RegisterCompressedCodec(const CompressedCodec& codec);
// The codec of a tag RegisterCompressedCodec returned. Thread-safe.
const CompressedCodec& FindCompressedCodec(uint32_t tag);

// Decodes `window` of `m` with its codec.
inline void DecodeCompressed(const CompressedDense& m, const CompressedWindow& window, float* out) {
  FindCompressedCodec(m.info.codec).decode_f32(m.object, m.info, window, out);
}
inline void DecodeCompressed(const CompressedDense& m, const CompressedWindow& window, double* out) {
  FindCompressedCodec(m.info.codec).decode_f64(m.object, m.info, window, out);
}

}  // namespace conveyor
