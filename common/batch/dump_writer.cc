#include "common/batch/dump_writer.h"

#include "common/batch/half.h"

#include <charconv>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor {

namespace {
template <typename T>
void AppendReal(T v, int precision, std::string* out) {
  if (std::isnan(v)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(v)) {
    out->append(v > 0 ? "Infinity" : "-Infinity");
    return;
  }
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, precision);
  out->append(buf, r.ptr);
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int64_t LoadIndex(const ArrayDesc& a, const std::byte* base, uint64_t i) {
  return a.dtype == DType::kInt64 ? Load<int64_t>(base + a.offset + i * 8)
                                  : Load<int32_t>(base + a.offset + i * 4);
}

// A CSR stream read by columns: for column c, entries [colptr[c], colptr[c+1]) of `row`
// (its row index) and `entry` (its position in the CSR arrays), rows ascending.
struct Columns {
  std::vector<uint64_t> colptr;
  std::vector<int32_t> row;
  std::vector<uint64_t> entry;
};

Columns CsrColumns(const StreamLayout& L, uint64_t cols, const std::byte* base) {
  Columns c;
  c.colptr.assign(cols + 1, 0);
  c.row.resize(L.nnz);
  c.entry.resize(L.nnz);
  for (uint64_t k = 0; k < L.nnz; ++k) ++c.colptr[Load<int32_t>(base + L.colind.offset + k * 4) + 1];
  for (uint64_t j = 0; j < cols; ++j) c.colptr[j + 1] += c.colptr[j];
  std::vector<uint64_t> next(c.colptr.begin(), c.colptr.end() - 1);
  for (uint64_t r = 0; r < L.dim; ++r) {
    for (int64_t k = LoadIndex(L.rowptr, base, r); k < LoadIndex(L.rowptr, base, r + 1); ++k) {
      const uint64_t at = next[Load<int32_t>(base + L.colind.offset + k * 4)]++;
      c.row[at] = static_cast<int32_t>(r);
      c.entry[at] = static_cast<uint64_t>(k);
    }
  }
  return c;
}

template <typename T>
void AppendStream(const StreamLayout& L, const PlacedPiece& p, uint32_t count, const std::byte* base,
                  const Columns* csr, std::string* out) {
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  // Values narrowed to float16/bfloat16 print as the float32 they are exactly.
  auto value = [&](uint64_t i) -> T {
    if (L.values.dtype == DType::kFloat16) return HalfBitsToFloat(Load<uint16_t>(base + L.values.offset + 2 * i));
    if (L.values.dtype == DType::kBFloat16) return BFloat16BitsToFloat(Load<uint16_t>(base + L.values.offset + 2 * i));
    return Load<T>(base + L.values.offset + i * sizeof(T));
  };
  if (L.ids()) {
    out->append("{\"ids\":[");
    for (uint64_t t = 0; t < count; ++t) {
      if (t) out->push_back(',');
      absl::StrAppend(out, "[", Load<int32_t>(base + L.values.offset + ((p.row * T_len + p.t0 + t) * 4)), "]");
    }
    out->append("]}");
    return;
  }
  if (L.dense_values()) {
    out->append("{\"dense\":[");
    for (uint64_t t = 0; t < count; ++t) {
      if (t) out->push_back(',');
      out->push_back('[');
      const uint64_t row = (p.row * T_len + p.t0 + t) * L.dim;
      for (uint32_t j = 0; j < L.dim; ++j) {
        if (j) out->push_back(',');
        AppendNumber(value(row + j), out);
      }
      out->push_back(']');
    }
    out->append("]}");
    return;
  }
  out->append("{\"sparse\":[");
  for (uint64_t t = 0; t < count; ++t) {
    if (t) out->push_back(',');
    out->push_back('[');
    const uint64_t col = p.row * T_len + p.t0 + t;
    if (csr != nullptr) {
      for (uint64_t k = csr->colptr[col]; k < csr->colptr[col + 1]; ++k) {
        if (k > csr->colptr[col]) out->push_back(',');
        absl::StrAppend(out, "[", csr->row[k], ",");
        AppendNumber(value(csr->entry[k]), out);
        out->push_back(']');
      }
      out->push_back(']');
      continue;
    }
    const int64_t b = LoadIndex(L.colptr, base, col), e = LoadIndex(L.colptr, base, col + 1);
    for (int64_t k = b; k < e; ++k) {
      if (k > b) out->push_back(',');
      out->push_back('[');
      absl::StrAppend(out, Load<int32_t>(base + L.rowind.offset + k * 4));
      out->push_back(',');
      AppendNumber(value(static_cast<uint64_t>(k)), out);
      out->push_back(']');
    }
    out->push_back(']');
  }
  out->append("]}");
}
}  // namespace

namespace {

// The length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 if none starts there:
// no overlong forms, no UTF-16 surrogates (U+D800-DFFF), nothing past U+10FFFF.
size_t Utf8SequenceAt(const std::string& s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

void AppendJsonStringBody(const std::string& s, std::string* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8SequenceAt(s, i);
    if (n == 0) {
      // Not UTF-8: the byte as Python's surrogateescape code point, U+DC80-U+DCFF.
      absl::StrAppend(out, "\\udc", absl::Hex(c, absl::kZeroPad2));
      ++i;
    } else if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      absl::StrAppend(out, "\\u00", absl::Hex(c, absl::kZeroPad2));
      ++i;
    } else {
      out->append(s, i, n);
      i += n;
    }
  }
}

void AppendNumber(float v, std::string* out) { AppendReal(v, 9, out); }
void AppendNumber(double v, std::string* out) { AppendReal(v, 17, out); }

void AppendDump(uint64_t epoch, uint64_t batch, const BatchPlan& plan,
                absl::Span<const std::byte> bytes, const std::string& cursor, std::string* out) {
  const std::byte* base = bytes.data();
  if (plan.pieces.empty()) {
    if (!cursor.empty()) {
      absl::StrAppend(out, "{\"epoch\":", epoch, ",\"batch\":", batch, ",\"empty\":true,\"cursor\":\"",
                      cursor, "\"}\n");
    }
    return;
  }
  // Lines in row order (then time): the order sequences sit in the batch.
  std::vector<size_t> order(plan.pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PlacedPiece &x = plan.pieces[a], &y = plan.pieces[b];
    return x.row != y.row ? x.row < y.row : x.t0 < y.t0;
  });
  std::vector<Columns> csr(plan.streams.size());
  for (size_t s = 0; s < plan.streams.size(); ++s) {
    if (plan.streams[s].csr()) csr[s] = CsrColumns(plan.streams[s], plan.streams[s].columns(plan.shape.rows), base);
  }
  for (size_t n = 0; n < order.size(); ++n) {
    const PlacedPiece& p = plan.pieces[order[n]];
    absl::StrAppend(out, "{\"epoch\":", epoch, ",\"batch\":", batch, ",\"key\":\"");
    if (p.name.empty()) {
      absl::StrAppend(out, p.key);
    } else {
      AppendJsonStringBody(p.name, out);
    }
    if (p.frame >= 0) absl::StrAppend(out, "/", p.frame);
    out->append("\"");
    if (p.truncated) absl::StrAppend(out, ",\"slot\":", p.row, ",\"offset\":", p.sample_begin);
    out->append(",\"streams\":{");
    for (size_t s = 0; s < plan.streams.size(); ++s) {
      if (s) out->push_back(',');
      // Stream names come from the configuration: escape what JSON requires.
      out->push_back('"');
      for (char c : plan.streams[s].name) {
        if (c == '"' || c == '\\') out->push_back('\\');
        out->push_back(c);
      }
      out->append("\":");
      if (plan.precision == Precision::kFloat) {
        AppendStream<float>(plan.streams[s], p, plan.count(order[n], s), base, plan.streams[s].csr() ? &csr[s] : nullptr, out);
      } else {
        AppendStream<double>(plan.streams[s], p, plan.count(order[n], s), base, plan.streams[s].csr() ? &csr[s] : nullptr, out);
      }
    }
    out->push_back('}');
    if (n + 1 == order.size() && !cursor.empty()) absl::StrAppend(out, ",\"cursor\":\"", cursor, "\"");
    out->append("}\n");
  }
}

}  // namespace conveyor
