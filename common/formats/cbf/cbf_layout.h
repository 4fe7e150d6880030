// cbf_layout.h: internal to formats/cbf/: what cbf_reader.cc (the entry points, the index,
// finishing a parsed chunk) shares with the files of the two layouts, cbf_cntk_layout.cc
// (ctf2bin's, magic "cntk_bin") and cbf_documented_layout.cc (the documentation's, version
// first). cbf_reader.h describes both layouts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chunk/parsed_chunk.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/index/index.h"

namespace conveyor::cbf {

// A bounds-checked little-endian reader over [pos, end) of the file, whose bytes from offset
// `base` on are `bytes` (the whole file, or a chunk as read; [pos, end) must lie in them).
class Reader {
 public:
  Reader(std::string_view bytes, uint64_t pos, uint64_t end, uint64_t base = 0)
      : bytes_(bytes), base_(base), pos_(pos), end_(end) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return end_ - pos_; }
  template <typename T>
  bool Read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + (pos_ - base_), sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // `count` items of `size` bytes: a view of them, or false if they do not fit.
  bool Take(uint64_t count, uint64_t size, const char** out) {
    uint64_t n = 0;
    if (__builtin_mul_overflow(count, size, &n) || n > left()) return false;
    *out = bytes_.data() + (pos_ - base_);
    pos_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  uint64_t base_, pos_, end_;
};

// A V at `p`, any alignment.
template <typename V>
inline V Load(const char* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// True when each of the `count` int32 at `p` (any alignment) lies in [0, dim), dim >= 1:
// as unsigned, a negative index is past any bound up to 2^31, so one comparison checks both
// ends (a dim past 2^31, which a header may claim, is clamped to 2^31: int32 indices end
// there, and a negative one must not pass as a large row). Every sparse entry of a CBF chunk
// is checked so as it is decoded: 8 at a time where the processor has AVX2 (asked at run
// time; the build targets any x86-64), else 4 (SSE2), else one. The variants are in
// `detail` for the test that holds them to the same answers.
namespace detail {

inline bool IndicesBelowScalar(const char* p, uint64_t count, uint32_t dim) {
  dim = std::min<uint32_t>(dim, 0x80000000u);
  uint32_t over = 0;
  for (uint64_t k = 0; k < count; ++k) over |= Load<uint32_t>(p + 4 * k) >= dim;
  return over == 0;
}

#if defined(__SSE2__)
inline bool IndicesBelowSse2(const char* p, uint64_t count, uint32_t dim) {
  if (count < 4) return IndicesBelowScalar(p, count, dim);
  dim = std::min<uint32_t>(dim, 0x80000000u);
  // 4 at a time, the last 4 overlapping the ones before; SSE2 compares signed, so both
  // sides are shifted by 2^31 to compare as unsigned.
  const __m128i flip = _mm_set1_epi32(INT32_MIN);
  const __m128i most = _mm_set1_epi32(static_cast<int32_t>((dim - 1) ^ 0x80000000u));
  __m128i over = _mm_setzero_si128();
  for (uint64_t k = 0; k + 4 < count; k += 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * k));
    over = _mm_or_si128(over, _mm_cmpgt_epi32(_mm_xor_si128(v, flip), most));
  }
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * (count - 4)));
  over = _mm_or_si128(over, _mm_cmpgt_epi32(_mm_xor_si128(v, flip), most));
  return _mm_movemask_epi8(over) == 0;
}
#endif

#if defined(__x86_64__) && defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define CONVEYOR_CBF_AVX2 1
// 8 at a time, the last 8 overlapping; unsigned v > dim - 1 exactly when max(v, dim - 1) is
// not dim - 1. Only called where __builtin_cpu_supports("avx2").
__attribute__((target("avx2"))) inline bool IndicesBelowAvx2(const char* p, uint64_t count, uint32_t dim) {
  if (count < 8) return IndicesBelowSse2(p, count, dim);
  dim = std::min<uint32_t>(dim, 0x80000000u);
  const __m256i most = _mm256_set1_epi32(static_cast<int32_t>(dim - 1));
  __m256i over = _mm256_setzero_si256();
  for (uint64_t k = 0; k + 8 < count; k += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * k));
    over = _mm256_or_si256(over, _mm256_xor_si256(_mm256_max_epu32(v, most), most));
  }
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * (count - 8)));
  over = _mm256_or_si256(over, _mm256_xor_si256(_mm256_max_epu32(v, most), most));
  return _mm256_testz_si256(over, over) != 0;
}
#endif

}  // namespace detail

inline bool IndicesBelow(const char* p, uint64_t count, uint32_t dim) {
#if defined(CONVEYOR_CBF_AVX2)
  if (count >= 8 && __builtin_cpu_supports("avx2")) return detail::IndicesBelowAvx2(p, count, dim);
#endif
#if defined(__SSE2__)
  return detail::IndicesBelowSse2(p, count, dim);
#else
  return detail::IndicesBelowScalar(p, count, dim);
#endif
}

inline auto BadHeader(const std::string& path) {
  return [&path](uint64_t at, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": byte ", at, ": ", what, " (not a valid CNTK binary file)"));
  };
}

// --- Layout 1, ctf2bin's (cbf_cntk_layout.cc).
// The header and chunk table of a file whose magic number was read. Errors: as ReadCbfFile.
absl::StatusOr<CbfFile> ReadCntkLayout(std::string_view bytes, const std::string& path);
// Decodes chunk `chunk_id` into `out` from `bytes`, the file's bytes from offset `base` on
// (the chunk's among them). Errors: as ParseCbfChunk.
absl::Status DecodeCntkLayoutChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index, uint64_t chunk_id,
                                   const std::vector<int>& source, Precision precision, const std::string& path,
                                   ParsedChunk* out);
// The per-sequence sample `counts` of chunk `chunk_id`'s delivered streams (stream-major),
// read from each sequence's u32 n with its values skipped, checked as the decoder checks
// them. Errors: as ParseCbfChunk, the same ones where the decoder would fail.
absl::Status CountCntkLayoutChunk(std::string_view bytes, const CbfFile& file, uint64_t chunk_id,
                                  const std::vector<int>& source, Precision precision,
                                  const std::string& path, std::vector<uint32_t>* counts);

// --- Layout 2, the documentation's (cbf_documented_layout.cc).
// Samples are implied by row codes, not stored, so a few bytes could claim billions of them:
// bounds on what one sequence and one chunk may hold (a sequence of 2^20 frames is 3 hours
// of speech at 100 frames a second).
inline constexpr uint32_t kMaxDocumentedSequence = 1u << 20;
inline constexpr uint64_t kMaxDocumentedChunkSamples = 1u << 26;

// One input's section of a kDocumented chunk, located and checked.
struct DocumentedInput {
  const char* dense = nullptr;  // dense: numSequences * dim elements
  uint32_t nnz = 0;             // sparse: entries, rows (sample * dim + index), colStart[numSequences + 1]
  const char *values = nullptr, *rows = nullptr, *starts = nullptr;
  std::vector<uint32_t> samples;  // per sequence: its samples in this input
};

inline uint32_t ElemSize(const CbfStreamInfo& info) { return info.precision == Precision::kFloat ? 4 : 8; }

inline int32_t LoadI32(const char* p, uint64_t i) {
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// The header and offsets table of a file whose version (1) was read. Errors: as ReadCbfFile.
absl::StatusOr<CbfFile> ReadDocumentedLayout(std::string_view bytes, const std::string& path);
// Locates every input's section of chunk `c` and checks it whole (see cbf_documented_layout.cc);
// `bytes`: the file's from offset `base` on.
absl::Status WalkDocumentedChunk(std::string_view bytes, uint64_t base, const CbfFile& file, uint64_t c,
                                 const std::string& path, std::vector<DocumentedInput>* inputs,
                                 std::vector<uint32_t>* lengths);
// Decodes chunk `chunk_id` into `out`, `bytes` as for DecodeCntkLayoutChunk. Errors: as ParseCbfChunk.
absl::Status DecodeDocumentedLayoutChunk(std::string_view bytes, uint64_t base, const CbfFile& file, const Index& index,
                                         uint64_t chunk_id, const std::vector<int>& source, Precision precision,
                                         const std::string& path, ParsedChunk* out);
// The per-sequence sample `counts` of chunk `chunk_id`'s delivered streams (stream-major),
// from WalkDocumentedChunk alone: the decoder's only check, so the same errors.
absl::Status CountDocumentedLayoutChunk(std::string_view bytes, const CbfFile& file,
                                        uint64_t chunk_id, const std::vector<int>& source,
                                        const std::string& path, std::vector<uint32_t>* counts);

// --- Shared by both layouts' decoders (cbf_reader.cc).
// Per sequence of `n_seq`, its slot among those delivered (-1: none), from the sample
// `counts` per delivered stream (stream-major); see cbf_reader.cc.
HugeVector<int32_t> DeliveredSlots(const std::vector<uint32_t>& counts, uint32_t n_seq);
// The chunk's slots, keys and lengths from its sequences' sample `counts` per delivered
// stream (stream-major); see cbf_reader.cc.
void FinishChunk(const std::vector<uint32_t>& counts, const std::vector<uint32_t>& lengths, const Index& index,
                 const ChunkEntry& ce, ParsedChunk* out);

}  // namespace conveyor::cbf
