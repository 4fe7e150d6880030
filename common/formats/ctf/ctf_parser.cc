#include "common/formats/ctf/ctf_parser.h"

#include <fast_float/fast_float.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/ctf/ctf_number.h"

namespace conveyor {
namespace {

// A delimiter between values and inputs: space, tab, and control characters but '\n'.
inline bool IsDelimiter(char c) {
  return c == ' ' || c == '\t' || (static_cast<unsigned char>(c) < 0x20 && c != '\n');
}
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }
// Appends the digits at *q to *m while fewer than 19 are taken in all (*n counts them).
inline void AccumulateDigits(const char** q, const char* end, uint64_t* m, int* n) {
  while (*q < end && *n < 19) {
    const unsigned d = static_cast<unsigned char>(**q) - '0';
    if (d > 9) return;
    *m = *m * 10 + d;
    ++*q;
    ++*n;
  }
}
// What may follow a number: end of input, a delimiter, '|' or the end of the line.
inline bool EndsValue(const char* p, const char* end) {
  return p == end || *p == '|' || *p == '\n' || IsDelimiter(*p);
}

std::string Printable(char c) {
  if (c == '\n') return "end of line";
  if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
    return absl::StrCat("byte 0x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  return absl::StrCat("'", std::string(1, c), "'");
}

template <typename T>
class ChunkParser {
  static constexpr uint64_t kExactMantissa = ctf::ExactDecimal<T>::kMantissa;
  static constexpr int kMaxExactPow10 = ctf::ExactDecimal<T>::kMaxPow10;
  static constexpr T kPow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

 public:
  ChunkParser(const CtfParserOptions& options, int main_stream, Diagnostics* diagnostics,
              ErrorBudget* budget, std::string_view file, uint64_t base, ParsedChunk* out)
      : options_(options), main_stream_(main_stream), diagnostics_(diagnostics), budget_(budget),
        file_(file), base_(base), out_(out), last_row_(options.streams.size(), 0) {}

  // Parses one sequence; on a sequence error spends the budget and drops it. Returns false
  // once the budget is exceeded (status() says why).
  bool Sequence(const SequenceEntry& s) {
    if (s.offset < base_ || s.offset - base_ > file_.size() || s.size > file_.size() - (s.offset - base_)) {
      status_ = absl::InternalError(absl::StrCat(options_.path, ": sequence ", s.key, " (bytes ", s.offset, "+", s.size,
                                                 ") lies outside the bytes given (", base_, "+", file_.size(),
                                                 "): the index does not match the file"));
      return false;
    }
    const char* p = file_.data() + (s.offset - base_);
    const char* const end = p + s.size;
    line_ = s.line;
    line_start_ = p;
    key_ = s.key;
    error_.clear();
    Save();
    uint64_t rows = 0;
    while (p < end && error_.empty()) {
      bool blank = true;
      if (!Row(&p, end, &blank)) break;
      if (!blank) ++rows;
    }
    if (error_.empty()) Finish(s, rows);
    if (!error_.empty()) {
      Restore();
      out_->slot_of.push_back(-1);
      if (!budget_->Spend()) {
        status_ = absl::DataLossError(budget_->Exceeded(error_));
        return false;
      }
      diagnostics_->Report(Severity::kWarning, "skipped sequence",
                           absl::StrCat(error_, "; sequence ", key_, " skipped"));
      return true;
    }
    out_->slot_of.push_back(static_cast<int32_t>(out_->keys.size()));
    out_->keys.push_back(s.key);
    out_->lengths.push_back(length_);
    for (auto& st : out_->streams) st.sequence_begin.push_back(SampleCount(st));
    return true;
  }

  const absl::Status& status() const { return status_; }

 private:
  void Fail(const char* at, const std::string& what) {
    if (!error_.empty()) return;
    error_ = absl::StrCat(options_.path, ":", line_ + 1, ":", at - line_start_ + 1, ": ", what);
  }

  static uint64_t SampleCount(const ParsedStream& st) {
    return st.format == StreamFormat::kDense ? st.values<T>().size() / st.dim
                                             : st.nnz_begin.size() - 1;
  }

  void Save() {
    saved_.resize(out_->streams.size());
    for (size_t i = 0; i < out_->streams.size(); ++i) {
      const auto& st = out_->streams[i];
      saved_[i] = {st.values<T>().size(), st.indices.size(), st.nnz_begin.size()};
    }
  }
  void Restore() {
    for (size_t i = 0; i < out_->streams.size(); ++i) {
      auto& st = out_->streams[i];
      st.values<T>().resize(saved_[i].values);
      st.indices.resize(saved_[i].indices);
      st.nnz_begin.resize(saved_[i].nnz);
    }
  }

  // Checks the sequence as a whole and sets length_.
  void Finish(const SequenceEntry& s, uint64_t rows) {
    uint64_t longest = 0;
    for (size_t i = 0; i < out_->streams.size(); ++i) {
      const auto& st = out_->streams[i];
      const uint64_t n = SampleCount(st) - (st.format == StreamFormat::kDense
                                                ? saved_[i].values / st.dim
                                                : saved_[i].nnz - 1);
      longest = std::max(longest, n);
      if (static_cast<int>(i) == main_stream_) length_ = n;
    }
    const char* first = file_.data() + (s.offset - base_);
    line_ = s.line;
    line_start_ = first;
    if (rows > longest) {
      Fail(first, absl::StrCat("sequence ", s.key, " has ", rows, " rows but its longest input has ",
                               longest, " samples: expected one sample of the longest input on every row"));
      return;
    }
    if (main_stream_ < 0) {
      length_ = longest;
    } else if (length_ == 0) {
      Fail(first, absl::StrCat("sequence ", s.key, " has no sample of input '",
                               options_.streams[main_stream_].name, "', which defines the minibatch size"));
    }
  }

  // One row, up to and including its '\n'. Returns false on an error.
  bool Row(const char** pp, const char* end, bool* blank) {
    const char* p = *pp;
    ++row_serial_;
    // A row may start with a sequence id (digits); it was handled by the indexer.
    while (p < end && IsDigit(*p)) {
      ++p;
      *blank = false;
    }
    bool any_sample = false;
    while (p < end) {
      const char c = *p;
      if (c == '\n') {
        ++p;
        break;
      }
      if (IsDelimiter(c)) {
        ++p;
        continue;
      }
      *blank = false;
      if (c != '|') {
        Fail(p, absl::StrCat("unexpected ", Printable(c), ": expected '|' and an input name"));
        return false;
      }
      ++p;
      if (p < end && *p == '#') {  // comment: to the next '|' or the end of the line
        while (p < end && *p != '|' && *p != '\n') ++p;
        continue;
      }
      const char* name = p;
      while (p < end && *p != '|' && !IsDelimiter(*p) && *p != '\n') ++p;
      if (p == name) {
        Fail(name, absl::StrCat("'|' is followed by ", p < end ? Printable(*p) : "the end of the file",
                                ": expected an input name"));
        return false;
      }
      const std::string_view alias(name, p - name);
      int stream = -1;
      for (size_t i = 0; i < options_.streams.size(); ++i) {
        if (options_.streams[i].alias == alias) {
          stream = static_cast<int>(i);
          break;
        }
      }
      if (stream < 0) {  // not configured: skip it (a file may carry more inputs)
        diagnostics_->Report(Severity::kInfo, "unknown input",
                             absl::StrCat(options_.path, ":", line_ + 1, ":", name - line_start_,
                                          ": skipping input '", std::string(alias), "', which the configuration does not name"));
        while (p < end && *p != '|' && *p != '\n') ++p;
        continue;
      }
      if (last_row_[stream] == row_serial_) {
        Fail(name - 1, absl::StrCat("input '", std::string(alias), "' appears twice on one row: expected one sample per input per row"));
        return false;
      }
      last_row_[stream] = row_serial_;
      ParsedStream& st = out_->streams[stream];
      const bool ok = st.format == StreamFormat::kDense ? Dense(&p, end, stream, &st)
                                                        : Sparse(&p, end, stream, &st);
      if (!ok) return false;
      any_sample = true;
    }
    if (!any_sample && !*blank) {
      Fail(*pp, "empty row: expected at least one input named in the configuration");
      return false;
    }
    if (p <= end && p > *pp && p[-1] == '\n') {
      ++line_;
      line_start_ = p;
    }
    *pp = p;
    return true;
  }

  // Parses one real at *pp. The common case (a plain decimal whose digits fit the mantissa
  // exactly, with an exact power of ten: Clinger's fast path, one correctly rounded
  // division) is inlined; everything else, exponents and errors included, goes to RealSlow.
  __attribute__((always_inline)) inline bool Real(const char** pp, const char* end, int stream, T* value) {
    const char* q = *pp;
    const bool neg = q < end && *q == '-';
    q += (q < end && (*q == '-' || *q == '+')) ? 1 : 0;
    const char* const first = q;
    uint64_t m = 0;
    int n = 0;
    AccumulateDigits(&q, end, &m, &n);
    int frac = 0;
    if (n > 0 && q < end && *q == '.') {
      ++q;
      const int before = n;
      AccumulateDigits(&q, end, &m, &n);
      frac = n - before;
    }
    if (q > first && IsDigit(*first) && m <= kExactMantissa && frac <= kMaxExactPow10 &&
        (q == end || *q == ' ' || *q == '|' || *q == '\n' || *q == '\t' ||
         (static_cast<unsigned char>(*q) < 0x20))) {
      const T v = static_cast<T>(m) / kPow10[frac];
      *value = ctf::WithSign(v, neg);
      *pp = q;
      return true;
    }
    return RealSlow(pp, end, stream, value);
  }

  __attribute__((noinline)) bool RealSlow(const char** pp, const char* end, int stream, T* value) {
    const auto what = [&] { return absl::StrCat("input '", options_.streams[stream].name, "'"); };
    const char* p = *pp;
    const char* digits = p;
    if (p == end) {
      Fail(p, absl::StrCat("unexpected end of input: expected a number for ", what()));
      return false;
    }
    if (*p == '+') {
      ++p;
      digits = p;
    } else if (*p == '-') {
      digits = p + 1;
    }
    if (digits == end || !IsDigit(*digits)) {
      Fail(*pp, absl::StrCat("unexpected ", digits == end ? "end of input" : Printable(*digits),
                             ": expected a number for ", what()));
      return false;
    }
    auto r = fast_float::from_chars(p, end, *value);
    if (r.ec != std::errc() || !std::isfinite(*value)) {
      Fail(*pp, absl::StrCat("number out of range for ", what()));
      return false;
    }
    if (!EndsValue(r.ptr, end)) {
      Fail(r.ptr, absl::StrCat("unexpected ", Printable(*r.ptr), " in a number for ", what()));
      return false;
    }
    *pp = r.ptr;
    return true;
  }

#if CTF_SIMD_NUMBERS
  // How far the fast paths may read from a position before `end`, the end of the sequence.
  // When the sequence ends with its newline, to the end of the file: every number, index
  // and shape test stops at that newline, so what lies past it is loaded but never used
  // (the loads are what may pass it). Otherwise (a last line without one) to `end`.
  const char* ReadLimit(const char* end) const {
    return end[-1] == '\n' ? file_.data() + file_.size() : end;
  }
#endif

  bool Dense(const char** pp, const char* end, int stream, ParsedStream* st) {
    const char* p = *pp;
    HugeVector<T>& values = st->values<T>();
    const uint32_t dim = st->dim;
    const size_t base = values.size();
    values.resize(base + dim);  // (not zeroed: HugePageAllocator)
    T* out = values.data() + base;
#if CTF_SIMD_NUMBERS
    const char* const limit = ReadLimit(end);
#endif
    uint32_t n = 0;
    while (true) {
#if CTF_SIMD_NUMBERS
      // Bulk: values of the common shape one space apart, while the reads stay in the file.
      {
        const char* q = p;
        while (n < dim && limit - q >= 1 + ctf::kSseRealBytes && *q == ' ' && ctf::SseReal(q + 1, &q, out + n)) ++n;
        p = q;
      }
#endif
      while (p < end && IsDelimiter(*p)) ++p;
      if (p == end || *p == '|' || *p == '\n') break;
      if (n == dim) {
        Fail(p, absl::StrCat("input '", options_.streams[stream].name, "' has more than dim=", dim,
                             " values: expected at most ", dim));
        return false;
      }
      if (!Real(&p, end, stream, out + n)) return false;
      ++n;
    }
    if (n < dim) {
      std::fill(out + n, out + dim, T{0});  // a short sample is zero-padded (values [0, n) written above)
      diagnostics_->Report(Severity::kWarning, "short dense sample",
                           absl::StrCat(options_.path, ":", line_ + 1, ":", *pp - line_start_ + 1,
                                        ": input '", options_.streams[stream].name, "' has ", n,
                                        " of dim=", dim, " values; zero-padded"));
    }
    *pp = p;
    return true;
  }

  bool Sparse(const char** pp, const char* end, int stream, ParsedStream* st) {
    const char* p = *pp;
    HugeVector<T>& values = st->values<T>();
    const uint64_t dim = st->dim;
#if CTF_SIMD_NUMBERS
    const char* const limit = ReadLimit(end);
#endif
    while (true) {
#if CTF_SIMD_NUMBERS
      // Bulk: entries "index:value" one space apart, while the reads stay in the file; "1"
      // and the shapes of SseReal as values. Anything else (errors included) is left whole
      // to the general path below.
      {
        const char* q = p;
        // ' ', an index of up to 7 digits, ':', then SseReal's reads.
        constexpr int kEntryBytes = 1 + 7 + 1 + ctf::kSseRealBytes;
        // Entries gathered here and appended a run at a time: GCC keeps the vectors'
        // push_back out of line (a call per entry, a fifth of a sparse parse in perf).
        constexpr int kRun = 32;
        int32_t run_indices[kRun];
        T run_values[kRun];
        int run = 0;
        auto flush = [&] {
          st->indices.insert(st->indices.end(), run_indices, run_indices + run);
          values.insert(values.end(), run_values, run_values + run);
          run = 0;
        };
        while (limit - q >= kEntryBytes && *q == ' ') {
          uint64_t idx;
          const char* colon;
          if (!ctf::SwarIndex(q + 1, &colon, &idx) || *colon != ':' || idx >= dim) break;
          const char* v = colon + 1;
          T value;
          if (v[0] == '1' && ctf::EndsNumber(v[1])) {
            value = 1;
            q = v + 1;
          } else if (!ctf::SseReal(v, &q, &value)) {
            break;
          }
          run_indices[run] = static_cast<int32_t>(idx);
          run_values[run] = value;
          if (++run == kRun) flush();
        }
        if (run > 0) flush();
        p = q;
      }
#endif
      while (p < end && IsDelimiter(*p)) ++p;
      if (p == end || *p == '|' || *p == '\n') break;
      if (!IsDigit(*p)) {
        Fail(p, absl::StrCat("unexpected ", Printable(*p), ": expected a sparse index (0 to ", dim - 1,
                             ") for input '", options_.streams[stream].name, "'"));
        return false;
      }
      const char* idx_begin = p;
      uint64_t idx = 0;
      int n = 0;
      while (p < end) {
        const unsigned d = static_cast<unsigned char>(*p) - '0';
        if (d > 9) break;
        idx = idx * 10 + d;  // may wrap on absurd lengths: caught by the length check below
        ++p;
        ++n;
      }
      if (n > 10) idx = dim;  // dims are < 2^31: ten digits always suffice
      if (idx >= dim) {
        Fail(idx_begin, absl::StrCat("sparse index ", std::string(idx_begin, std::min<size_t>(p - idx_begin, 24)),
                                     " of input '", options_.streams[stream].name,
                                     "' is out of range: expected an index below dim=", dim));
        return false;
      }
      if (p == end || *p != ':') {
        Fail(p, absl::StrCat("unexpected ", p == end ? "end of input" : Printable(*p),
                             ": expected ':' after the sparse index ", idx));
        return false;
      }
      ++p;
      T v;
      if (!Real(&p, end, stream, &v)) return false;
      st->indices.push_back(static_cast<int32_t>(idx));
      values.push_back(v);
    }
    st->nnz_begin.push_back(st->indices.size());
    *pp = p;
    return true;
  }

  struct Saved {
    size_t values, indices, nnz;
  };
  const CtfParserOptions& options_;
  const int main_stream_;
  Diagnostics* const diagnostics_;
  ErrorBudget* const budget_;
  const std::string_view file_;  // the file's bytes from offset base_ on
  const uint64_t base_;
  ParsedChunk* const out_;
  std::vector<uint64_t> last_row_;
  std::vector<Saved> saved_;
  uint64_t row_serial_ = 0;
  uint64_t line_ = 0;
  const char* line_start_ = nullptr;
  uint64_t key_ = 0;
  uint64_t length_ = 0;
  std::string error_;
  absl::Status status_;
};

std::unique_ptr<ParsedChunk> NewChunk(const CtfParserOptions& options) {
  auto chunk = std::make_unique<ParsedChunk>();
  chunk->precision = options.precision;
  for (const auto& sc : options.streams) {
    ParsedStream st;
    st.format = sc.format;
    st.dim = static_cast<uint32_t>(sc.dim);
    chunk->streams.push_back(std::move(st));
  }
  return chunk;
}

template <typename T>
absl::Status ParseAll(const CtfParserOptions& options, int main_stream, Diagnostics* diagnostics,
                      ErrorBudget* budget, std::string_view file, uint64_t base, const SequenceEntry* begin,
                      const SequenceEntry* end, ParsedChunk* out) {
  ChunkParser<T> parser(options, main_stream, diagnostics, budget, file, base, out);
  for (const SequenceEntry* s = begin; s != end; ++s) {
    if (!parser.Sequence(*s)) return parser.status();
  }
  return absl::OkStatus();
}

}  // namespace

CtfParser::CtfParser(CtfParserOptions options, Diagnostics* diagnostics, ErrorBudget* budget)
    : options_(std::move(options)),
      diagnostics_(diagnostics),
      budget_(budget),
      entries_per_64k_(options_.streams.size()) {
  for (size_t i = 0; i < options_.streams.size(); ++i)
    if (options_.streams[i].defines_mb_size) main_stream_ = static_cast<int>(i);
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> CtfParser::ParseSequences(
    std::string_view file, const HugeVector<SequenceEntry>& sequences) const {
  auto chunk = NewChunk(options_);
  const SequenceEntry* b = sequences.data();
  const SequenceEntry* e = b + sequences.size();
  absl::Status st = options_.precision == Precision::kFloat
                        ? ParseAll<float>(options_, main_stream_, diagnostics_, budget_, file, 0, b, e, chunk.get())
                        : ParseAll<double>(options_, main_stream_, diagnostics_, budget_, file, 0, b, e, chunk.get());
  if (!st.ok()) return st;
  return chunk;
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> CtfParser::ParseChunk(std::string_view file, uint64_t base,
                                                                   const Index& index,
                                                                   uint64_t chunk_id) const {
  if (chunk_id >= index.chunks.size()) {
    return absl::OutOfRangeError(absl::StrCat("chunk ", chunk_id, " of ", index.chunks.size()));
  }
  const ChunkEntry& c = index.chunks[chunk_id];
  auto chunk = NewChunk(options_);
  chunk->chunk_id = chunk_id;
  // Reserve from the chunk's byte size: parsing then rarely reallocates.
  const uint64_t bytes = c.end_offset - c.begin_offset;
  chunk->keys.reserve(c.num_sequences);
  chunk->lengths.reserve(c.num_sequences);
  chunk->slot_of.reserve(c.num_sequences);
  // Rows bound every stream's samples; sparse entries take at least 4 bytes ("1:1 ").
  const bool f32 = options_.precision == Precision::kFloat;
  for (size_t s = 0; s < chunk->streams.size(); ++s) {
    auto& st = chunk->streams[s];
    st.sequence_begin.reserve(c.num_sequences + 1);
    if (st.format == StreamFormat::kSparse) {
      // As dense as the densest chunk so far (and a little more), else a guess: an entry
      // every 6 bytes, above the usual density ("12345:1 " is 8), since a guess short by
      // one entry doubles the arrays, and the first chunk then touches twice its memory
      // (134 MB sparse CTF, one epoch: 212 -> 140 MB of new pages). Reserved pages left
      // unused are never touched.
      const uint64_t seen = entries_per_64k_[s].load(std::memory_order_relaxed);
      const uint64_t nnz_guess = seen > 0 ? (bytes * seen >> 16) + (bytes * seen >> 21) + 64
                                          : bytes / 6 / chunk->streams.size();
      st.nnz_begin.reserve(c.num_samples + 1);
      st.indices.reserve(nnz_guess);
      if (f32) st.values_f32.reserve(nnz_guess); else st.values_f64.reserve(nnz_guess);
    } else {
      const uint64_t n = std::min<uint64_t>(c.num_samples * st.dim, bytes);
      if (f32) st.values_f32.reserve(n); else st.values_f64.reserve(n);
    }
  }
  const SequenceEntry* b = index.sequences.data() + c.first_sequence;
  const SequenceEntry* e = b + c.num_sequences;
  absl::Status st = options_.precision == Precision::kFloat
                        ? ParseAll<float>(options_, main_stream_, diagnostics_, budget_, file, base, b, e, chunk.get())
                        : ParseAll<double>(options_, main_stream_, diagnostics_, budget_, file, base, b, e, chunk.get());
  if (!st.ok()) return st;
  if (bytes > 0) {
    for (size_t s = 0; s < chunk->streams.size(); ++s) {
      if (chunk->streams[s].format != StreamFormat::kSparse) continue;
      const uint64_t density = (chunk->streams[s].indices.size() << 16) / bytes + 1;
      std::atomic<uint64_t>& most = entries_per_64k_[s];
      uint64_t was = most.load(std::memory_order_relaxed);
      while (density > was && !most.compare_exchange_weak(was, density, std::memory_order_relaxed)) {
      }
    }
  }
  return chunk;
}

}  // namespace conveyor
