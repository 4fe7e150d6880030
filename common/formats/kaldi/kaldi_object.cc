#include "common/formats/kaldi/kaldi_object.h"

#include <fast_float/fast_float.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/formats/kaldi/kaldi_cm_math.h"
#include "common/status_macros.h"
#include "common/text_lines.h"

namespace conveyor::kaldi {
namespace {

// Columns of at least this many rows decode CM through a 256-entry table (CmColumnTable);
// shorter ones call CmByte per value. Measured with build/bench/format_bench.
constexpr int64_t kCmTableRows = 48;



// CmColumnTable, compiled twice: for AVX2 (four doubles a vector, picked at run time where
// the CPU has it) and for the baseline. No FMA either way (this file: -ffp-contract=off).
// (Not under ThreadSanitizer: its instrumented ifunc resolver runs before the runtime is up
// and crashes the program at load.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
void CmTable(float p0, float p25, float p75, float p100, float* table) {
  CmColumnTable(p0, p25, p75, p100, table);
}

absl::Status Bad(uint64_t pos, std::string_view what) {
  return absl::DataLossError(absl::StrCat("byte ", pos, ": ", AV(what)));
}

std::string Show(std::string_view bytes, uint64_t pos) {
  if (pos >= bytes.size()) return "end of file";
  std::string out = "'";
  for (uint64_t i = pos; i < bytes.size() && i < pos + 12; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') out.push_back(static_cast<char>(c));
    else absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
  }
  return out + "'";
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A binary int32 with its size byte (0x04).
absl::StatusOr<int32_t> ReadInt32(std::string_view bytes, uint64_t* pos, std::string_view what) {
  if (bytes.size() - *pos < 5) return Bad(*pos, absl::StrCat("file ends inside ", AV(what), " (expected 5 bytes: 0x04 and an int32)"));
  if (bytes[*pos] != 4) {
    return Bad(*pos, absl::StrCat("expected the size byte 0x04 before ", AV(what), ", found 0x",
                                  absl::Hex(static_cast<unsigned char>(bytes[*pos]), absl::kZeroPad2)));
  }
  const int32_t v = Load<int32_t>(bytes.data() + *pos + 1);
  *pos += 5;
  return v;
}

// Token (letters and digits) followed by one space, after the `\0B` marker.
bool TokenIs(std::string_view bytes, uint64_t pos, std::string_view token) {
  return bytes.size() - pos > token.size() && bytes.compare(pos, token.size(), token) == 0 && bytes[pos + token.size()] == ' ';
}

constexpr int64_t kMaxElements = int64_t{1} << 40;

// One number of a text object: [-]digits[.digits][e[+-]digits], or inf/infinity/nan in any
// case (also after '-': Kaldi's reader cannot read back the "-inf" its writer writes; this one
// can). `end` is the end of the token.
template <typename T>
bool ParseNumber(const char* p, const char* end, T* out, bool allow_overflow = false) {
  if (p == end) return false;
  const bool neg = *p == '-';
  const char* q = neg ? p + 1 : p;
  if (q == end) return false;
  const bool word = !(*q >= '0' && *q <= '9');
  if (word) {
    std::string w(q, end);
    for (char& c : w) c = static_cast<char>(c | 0x20);
    T v;
    if (w == "inf" || w == "infinity") v = std::numeric_limits<T>::infinity();
    else if (w == "nan") v = std::numeric_limits<T>::quiet_NaN();
    else return false;
    *out = neg ? -v : v;
    return true;
  }
  auto r = fast_float::from_chars(p, end, *out);
  if (r.ec != std::errc() || r.ptr != end) return false;
  // Overflow is an error when scanning (as for istream >> Real); a double value beyond float
  // range read by a float reader becomes infinity, as (float)strtod gives.
  return allow_overflow || !std::isinf(*out);
}

inline bool EndsToken(char c) { return IsCSpace(c) || c == ']' || c == ';'; }

// Walks a text matrix or vector starting at `pos` (whitespace allowed before '['). Calls
// `value(row, col, token_begin, token_end)` for every number when `value` is given; returns
// the shape and the end (after the consumed newline).
struct TextShape {
  int64_t rows = 0, cols = 0;
  uint64_t end = 0;
};

template <typename F>
absl::StatusOr<TextShape> WalkText(std::string_view bytes, uint64_t pos, bool vector, F&& on_number) {
  const uint64_t n = bytes.size();
  while (pos < n && IsCSpace(bytes[pos])) ++pos;
  if (pos >= n || bytes[pos] != '[') {
    return Bad(pos, absl::StrCat("expected a binary object (\\0B) or a text ", vector ? "vector" : "matrix",
                                 " starting with '[', found ", Show(bytes, pos)));
  }
  ++pos;
  TextShape shape;
  int64_t col = 0;
  auto end_row = [&](uint64_t at) -> absl::Status {
    if (col == 0) return absl::OkStatus();
    if (shape.rows == 0) shape.cols = col;
    else if (col != shape.cols)
      return Bad(at, absl::StrCat("row ", shape.rows, " of a text matrix has ", col, " values, row 0 has ", shape.cols));
    ++shape.rows;
    col = 0;
    return absl::OkStatus();
  };
  while (true) {
    if (pos >= n) return Bad(pos, "file ends inside a text matrix (expected ']')");
    const char c = bytes[pos];
    if (c == ']') {
      if (!vector) RETURN_IF_ERROR(end_row(pos));
      ++pos;
      if (pos < n && bytes[pos] == '\r' && pos + 1 < n && bytes[pos + 1] == '\n') pos += 2;
      else if (pos < n && bytes[pos] == '\n') ++pos;
      break;
    }
    if ((c == '\n' || c == ';') && !vector) {
      RETURN_IF_ERROR(end_row(pos));
      ++pos;
      continue;
    }
    if (IsCSpace(c)) {
      ++pos;
      continue;
    }
    uint64_t e = pos;
    while (e < n && !EndsToken(bytes[e])) ++e;
    if (!on_number(pos, e)) {
      return Bad(pos, absl::StrCat("expected a number, found '", AV(bytes.substr(pos, std::min<uint64_t>(e - pos, 24))), "'"));
    }
    if (++col > kMaxElements) return Bad(pos, "text matrix too large");
    pos = e;
  }
  if (vector) {
    shape.cols = col;
    shape.rows = col > 0 ? 1 : 0;
  } else if (shape.rows == 0) {
    shape.cols = 0;
  }
  shape.end = pos;
  return shape;
}

absl::StatusOr<ObjectInfo> ScanBinary(std::string_view bytes, uint64_t pos, ObjectKind kind) {
  const uint64_t start = pos;
  pos += 2;  // \0B
  ObjectInfo info;
  if (kind == ObjectKind::kInt32Vector) {
    ASSIGN_OR_RETURN(int32_t len, ReadInt32(bytes, &pos, "the vector length"));
    if (len < 0) return Bad(pos - 4, absl::StrCat("negative vector length ", len));
    const uint64_t need = uint64_t{5} * static_cast<uint64_t>(len);
    if (bytes.size() - pos < need) {
      return Bad(pos, absl::StrCat("file ends inside an int32 vector of ", len, " elements (needs ", need, " bytes, ",
                                   bytes.size() - pos, " left)"));
    }
    for (int32_t i = 0; i < len; ++i) {
      if (bytes[pos + 5 * static_cast<uint64_t>(i)] != 4) {
        return Bad(pos + 5 * static_cast<uint64_t>(i),
                   absl::StrCat("expected the size byte 0x04 before element ", i, " of an int32 vector, found 0x",
                                absl::Hex(static_cast<unsigned char>(bytes[pos + 5 * static_cast<uint64_t>(i)]), absl::kZeroPad2)));
      }
    }
    info.type = ObjectType::kInt32Vector;
    info.rows = len > 0 ? 1 : 0;
    info.cols = len;
    info.size = pos + need - start;
    return info;
  }
  if (kind == ObjectKind::kVector) {
    int width;
    if (TokenIs(bytes, pos, "FV")) info.type = ObjectType::kFloatVector, width = 4;
    else if (TokenIs(bytes, pos, "DV")) info.type = ObjectType::kDoubleVector, width = 8;
    else return Bad(pos, absl::StrCat("expected the token FV or DV of a binary vector, found ", Show(bytes, pos)));
    pos += 3;
    ASSIGN_OR_RETURN(int32_t len, ReadInt32(bytes, &pos, "the vector length"));
    if (len < 0) return Bad(pos - 4, absl::StrCat("negative vector length ", len));
    const uint64_t need = static_cast<uint64_t>(width) * static_cast<uint64_t>(len);
    if (bytes.size() - pos < need) {
      return Bad(pos, absl::StrCat("file ends inside a vector of ", len, " values (needs ", need, " bytes, ", bytes.size() - pos, " left)"));
    }
    info.rows = len > 0 ? 1 : 0;
    info.cols = len;
    info.size = pos + need - start;
    return info;
  }
  // Matrices.
  if (TokenIs(bytes, pos, "FM") || TokenIs(bytes, pos, "DM")) {
    const bool dbl = bytes[pos] == 'D';
    info.type = dbl ? ObjectType::kDoubleMatrix : ObjectType::kFloatMatrix;
    pos += 3;
    ASSIGN_OR_RETURN(int32_t rows, ReadInt32(bytes, &pos, "the row count"));
    ASSIGN_OR_RETURN(int32_t cols, ReadInt32(bytes, &pos, "the column count"));
    if (rows < 0 || cols < 0) return Bad(pos - 10, absl::StrCat("negative matrix size ", rows, " x ", cols));
    if ((rows == 0) != (cols == 0)) return Bad(pos - 10, absl::StrCat("matrix size ", rows, " x ", cols, ": only 0 x 0 may be empty"));
    const uint64_t need = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * (dbl ? 8 : 4);
    if (bytes.size() - pos < need) {
      return Bad(pos, absl::StrCat("file ends inside a ", rows, " x ", cols, dbl ? " DM" : " FM", " matrix (needs ", need,
                                   " bytes, ", bytes.size() - pos, " left)"));
    }
    info.rows = rows;
    info.cols = cols;
    info.size = pos + need - start;
    return info;
  }
  int format = 0;
  if (TokenIs(bytes, pos, "CM")) format = 1, pos += 3;
  else if (TokenIs(bytes, pos, "CM2")) format = 2, pos += 4;
  else if (TokenIs(bytes, pos, "CM3")) format = 3, pos += 4;
  else return Bad(pos, absl::StrCat("expected a matrix token (FM, DM, CM, CM2, CM3), found ", Show(bytes, pos)));
  info.type = format == 1 ? ObjectType::kCompressed1 : format == 2 ? ObjectType::kCompressed2 : ObjectType::kCompressed3;
  if (bytes.size() - pos < 16) return Bad(pos, "file ends inside a compressed-matrix header (16 bytes)");
  info.min_value = Load<float>(bytes.data() + pos);
  info.range = Load<float>(bytes.data() + pos + 4);
  const int32_t rows = Load<int32_t>(bytes.data() + pos + 8);
  const int32_t cols = Load<int32_t>(bytes.data() + pos + 12);
  pos += 16;
  if (cols == 0) {
    // Empty. Kaldi writes the 20-byte in-memory header but reads 16: the 4 bytes left over
    // are the header's num_cols, zero. Kaldi then reads them as the start of the next key
    // (README 4.9); a key cannot start with NUL, so they belong to this object.
    if (bytes.size() - pos >= 4 && Load<uint32_t>(bytes.data() + pos) == 0) pos += 4;
    info.size = pos - start;
    return info;
  }
  if (rows <= 0 || cols < 0) return Bad(pos - 8, absl::StrCat("bad compressed-matrix size ", rows, " x ", cols));
  const uint64_t r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
  const uint64_t need = format == 1 ? c * (8 + r) : format == 2 ? 2 * r * c : r * c;
  if (bytes.size() - pos < need) {
    return Bad(pos, absl::StrCat("file ends inside a ", rows, " x ", cols, " CM", format == 1 ? "" : format == 2 ? "2" : "3",
                                 " matrix (needs ", need, " bytes, ", bytes.size() - pos, " left)"));
  }
  info.rows = rows;
  info.cols = cols;
  info.size = pos + need - start;
  return info;
}

}  // namespace

const char* ObjectTypeName(ObjectType t) {
  switch (t) {
    case ObjectType::kFloatMatrix: return "FM";
    case ObjectType::kDoubleMatrix: return "DM";
    case ObjectType::kCompressed1: return "CM";
    case ObjectType::kCompressed2: return "CM2";
    case ObjectType::kCompressed3: return "CM3";
    case ObjectType::kTextMatrix: return "text matrix";
    case ObjectType::kFloatVector: return "FV";
    case ObjectType::kDoubleVector: return "DV";
    case ObjectType::kTextVector: return "text vector";
    case ObjectType::kInt32Vector: return "int32 vector";
    case ObjectType::kTextInt32Vector: return "text int32 vector";
  }
  return "?";
}

absl::StatusOr<ObjectInfo> ScanObject(std::string_view bytes, uint64_t pos, ObjectKind kind) {
  if (pos > bytes.size()) return Bad(pos, "offset past the end of the file");
  if (bytes.size() - pos >= 1 && bytes[pos] == '\0') {
    if (bytes.size() - pos < 2 || bytes[pos + 1] != 'B') {
      return Bad(pos, absl::StrCat("expected the binary marker \\0B, found ", Show(bytes, pos)));
    }
    return ScanBinary(bytes, pos, kind);
  }
  ObjectInfo info;
  if (kind == ObjectKind::kInt32Vector) {
    // The rest of the line: integers separated by whitespace.
    uint64_t p = pos;
    const uint64_t n = bytes.size();
    int64_t count = 0;
    while (p < n && bytes[p] != '\n') {
      if (IsCSpace(bytes[p])) {
        ++p;
        continue;
      }
      uint64_t e = p;
      while (e < n && !IsCSpace(bytes[e])) ++e;
      int32_t v;
      const char* b = bytes.data() + p;
      if (*b == '+') ++b;
      auto r = std::from_chars(b, bytes.data() + e, v);
      if (r.ec != std::errc() || r.ptr != bytes.data() + e) {
        return Bad(p, absl::StrCat("expected an int32, found '", AV(bytes.substr(p, std::min<uint64_t>(e - p, 24))), "'"));
      }
      ++count;
      p = e;
    }
    if (p < n) ++p;  // the newline
    info.type = ObjectType::kTextInt32Vector;
    info.rows = count > 0 ? 1 : 0;
    info.cols = count;
    info.size = p - pos;
    return info;
  }
  const bool vector = kind == ObjectKind::kVector;
  auto shape = WalkText(bytes, pos, vector, [&](uint64_t b, uint64_t e) {
    double v;
    return ParseNumber(bytes.data() + b, bytes.data() + e, &v);
  });
  if (!shape.ok()) return shape.status();
  info.type = vector ? ObjectType::kTextVector : ObjectType::kTextMatrix;
  info.rows = shape->rows;
  info.cols = shape->cols;
  info.size = shape->end - pos;
  return info;
}

float CompressedPercentileToFloat(float min_value, float range, uint16_t v) { return CmPercentile(min_value, range, v); }

float CompressedByteToFloat(float p0, float p25, float p75, float p100, uint8_t v) { return CmByte(p0, p25, p75, p100, v); }

template <typename T>
void DecodeMatrix(std::string_view bytes, uint64_t pos, const ObjectInfo& info, const Window& w, T* out) {
  if (w.rows == 0 || w.cols == 0) return;
  const char* base = bytes.data() + pos;
  const int64_t R = info.rows, C = info.cols;
  switch (info.type) {
    case ObjectType::kFloatMatrix:
    case ObjectType::kDoubleMatrix:
    case ObjectType::kFloatVector:
    case ObjectType::kDoubleVector: {
      const bool dbl = info.type == ObjectType::kDoubleMatrix || info.type == ObjectType::kDoubleVector;
      const bool vec = info.type == ObjectType::kFloatVector || info.type == ObjectType::kDoubleVector;
      const char* data = base + (vec ? 2 + 3 + 5 : 2 + 3 + 10);
      for (int64_t r = 0; r < w.rows; ++r) {
        const char* row = data + ((w.row0 + r) * C + w.col0) * (dbl ? 8 : 4);
        T* o = out + r * w.cols;
        if (dbl == (sizeof(T) == 8)) {
          std::memcpy(o, row, static_cast<size_t>(w.cols) * sizeof(T));
        } else if (dbl) {
          for (int64_t c = 0; c < w.cols; ++c) o[c] = static_cast<T>(Load<double>(row + 8 * c));
        } else {
          for (int64_t c = 0; c < w.cols; ++c) o[c] = static_cast<T>(Load<float>(row + 4 * c));
        }
      }
      return;
    }
    case ObjectType::kCompressed1: {
      const char* headers = base + 2 + 3 + 16;
      const uint8_t* data = reinterpret_cast<const uint8_t*>(headers + 8 * C);
      float table[256];
      for (int64_t c = w.col0; c < w.col0 + w.cols; ++c) {
        const char* h = headers + 8 * c;
        const float p0 = CompressedPercentileToFloat(info.min_value, info.range, Load<uint16_t>(h));
        const float p25 = CompressedPercentileToFloat(info.min_value, info.range, Load<uint16_t>(h + 2));
        const float p75 = CompressedPercentileToFloat(info.min_value, info.range, Load<uint16_t>(h + 4));
        const float p100 = CompressedPercentileToFloat(info.min_value, info.range, Load<uint16_t>(h + 6));
        const uint8_t* col = data + c * R + w.row0;
        T* o = out + (c - w.col0);
        if (w.rows >= kCmTableRows) {
          // Every byte value decoded once (vectorized), then the same floats by lookup.
          CmTable(p0, p25, p75, p100, table);
          for (int64_t r = 0; r < w.rows; ++r) o[r * w.cols] = static_cast<T>(table[col[r]]);
        } else {
          for (int64_t r = 0; r < w.rows; ++r) o[r * w.cols] = static_cast<T>(CompressedByteToFloat(p0, p25, p75, p100, col[r]));
        }
      }
      return;
    }
    case ObjectType::kCompressed2: {
      const float inc = Cm2Increment(info.range);
      const char* data = base + 2 + 4 + 16;
      for (int64_t r = 0; r < w.rows; ++r) {
        const char* row = data + 2 * ((w.row0 + r) * C + w.col0);
        T* o = out + r * w.cols;
        for (int64_t c = 0; c < w.cols; ++c) {
          o[c] = static_cast<T>(CmLinear(info.min_value, inc, Load<uint16_t>(row + 2 * c)));
        }
      }
      return;
    }
    case ObjectType::kCompressed3: {
      // min + v * increment computed (vectorized), not looked up: cheaper than a gather.
      const float inc = Cm3Increment(info.range), min = info.min_value;
      const uint8_t* data = reinterpret_cast<const uint8_t*>(base + 2 + 4 + 16);
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* row = data + (w.row0 + r) * C + w.col0;
        T* o = out + r * w.cols;
        for (int64_t c = 0; c < w.cols; ++c) o[c] = static_cast<T>(CmLinear(min, inc, row[c]));
      }
      return;
    }
    case ObjectType::kTextMatrix:
    case ObjectType::kTextVector: {
      int64_t row = 0, col = 0;
      const bool vector = info.type == ObjectType::kTextVector;
      // Values are parsed in T (strtof for float readers, strtod for double ones).
      (void)WalkText(bytes, pos, vector, [&](uint64_t b, uint64_t e) {
        const int64_t rr = vector ? 0 : row, cc = vector ? col : col;
        if (rr >= w.row0 && rr < w.row0 + w.rows && cc >= w.col0 && cc < w.col0 + w.cols) {
          T v{};
          ParseNumber(bytes.data() + b, bytes.data() + e, &v, /*allow_overflow=*/true);
          out[(rr - w.row0) * w.cols + (cc - w.col0)] = v;
        }
        if (!vector && ++col == C) col = 0, ++row;
        else if (vector) ++col;
        return true;
      });
      return;
    }
    case ObjectType::kInt32Vector:
    case ObjectType::kTextInt32Vector:
      return;
  }
}

const char* ContiguousValues(std::string_view bytes, uint64_t pos, const ObjectInfo& info, const Window& w,
                             bool double_values) {
  const bool vec = info.type == ObjectType::kFloatVector || info.type == ObjectType::kDoubleVector;
  const bool dbl = info.type == ObjectType::kDoubleMatrix || info.type == ObjectType::kDoubleVector;
  const bool binary_plain = info.type == ObjectType::kFloatMatrix || info.type == ObjectType::kDoubleMatrix || vec;
  if (!binary_plain || dbl != double_values || w.col0 != 0 || w.cols != info.cols) return nullptr;
  if (bytes.size() < pos + 2 || bytes[pos] != '\0' || bytes[pos + 1] != 'B') return nullptr;  // text
  const char* data = bytes.data() + pos + (vec ? 2 + 3 + 5 : 2 + 3 + 10);
  return data + w.row0 * info.cols * (dbl ? 8 : 4);
}

template void DecodeMatrix<float>(std::string_view, uint64_t, const ObjectInfo&, const Window&, float*);
template void DecodeMatrix<double>(std::string_view, uint64_t, const ObjectInfo&, const Window&, double*);

namespace {

template <typename T>
void DecodeCompressedPayload(const char* object, const CompressedHeader& header, const CompressedWindow& window, T* out) {
  const ObjectInfo info = CompressedObjectInfo(header);
  Window w;
  w.row0 = window.row0;
  w.rows = window.rows;
  w.col0 = window.col0;
  w.cols = window.cols;
  DecodeMatrix<T>(std::string_view(object, info.size), 0, info, w, out);
}

}  // namespace

uint32_t CompressedCodecTag() {
  static const uint32_t tag = RegisterCompressedCodec(
      CompressedCodec{"KaldiCompressedMatrix", &DecodeCompressedPayload<float>, &DecodeCompressedPayload<double>});
  return tag;
}

CompressedHeader ToCompressedHeader(const ObjectInfo& info) {
  CompressedHeader h;
  h.codec = CompressedCodecTag();
  h.Store(info);
  return h;
}

ObjectInfo CompressedObjectInfo(const CompressedHeader& header) { return header.Load<ObjectInfo>(); }

void DecodeInt32Vector(std::string_view bytes, uint64_t pos, const ObjectInfo& info, std::vector<int32_t>* out) {
  out->clear();
  out->reserve(static_cast<size_t>(info.cols));
  if (info.type == ObjectType::kInt32Vector) {
    const char* p = bytes.data() + pos + 2 + 5 + 1;
    for (int64_t i = 0; i < info.cols; ++i) out->push_back(Load<int32_t>(p + 5 * i));
    return;
  }
  uint64_t p = pos;
  const uint64_t end = pos + info.size;
  while (p < end) {
    if (IsCSpace(bytes[p])) {
      ++p;
      continue;
    }
    uint64_t e = p;
    while (e < end && !IsCSpace(bytes[e])) ++e;
    const char* b = bytes.data() + p;
    if (*b == '+') ++b;
    int32_t v = 0;
    std::from_chars(b, bytes.data() + e, v);
    out->push_back(v);
    p = e;
  }
}

}  // namespace conveyor::kaldi
