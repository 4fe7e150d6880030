#include "common/formats/ctf/ctf_indexer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/index/index_cache.h"

namespace conveyor {
namespace {

// What one thread learns about its byte range [begin, end) (both at line starts).
struct RangeResult {
  HugeVector<SequenceEntry> sequences;  // lines relative to the range's first line
  bool first_has_id = false;            // else the first sequence continues the previous range's
  bool second_may_continue = false;      // the 2nd sequence's id may equal the previous range's
  uint64_t first_id = 0;
  uint64_t lines = 0;                    // newline-terminated lines (+1 for a final partial line)
  uint64_t inner_blanks = 0;             // blank lines followed by a non-blank line in this range
  uint64_t trailing_blanks = 0;          // blank lines after the last non-blank line
  std::vector<uint64_t> blank_lines;     // relative line numbers, first kMaxKept of them
  bool any_content = false;
  std::string error;                     // set on a fatal problem
  uint64_t error_line = 0;
  absl::Status read_error;               // CtfIndexOptions::read failed (returned as it is)
};

// The lines of a range: through the mapping, or (CtfIndexOptions::read) copied a window at
// a time into a buffer of this thread's, which stays in cache while it is scanned.
class RangeLines {
 public:
  RangeLines(std::string_view bytes, const CtfIndexOptions& options, uint64_t end)
      : base_(bytes.data()), end_(end), read_(options.read),
        window_(std::max<uint64_t>(options.read_window, 1)) {}

  // The line at `pos` (< end): its first byte, and its end (after its '\n', or the range's
  // end) in *eol.
  absl::Status Line(uint64_t pos, const char** text, uint64_t* eol) {
    if (read_) {
      while (true) {
        if (pos >= win_begin_ && pos < win_end_) {
          const char* p = buf_.get() + (pos - win_begin_);
          const char* nl = static_cast<const char*>(std::memchr(p, '\n', win_end_ - pos));
          if (nl != nullptr || win_end_ == end_) {
            *text = p;
            *eol = nl != nullptr ? win_begin_ + static_cast<uint64_t>(nl - buf_.get()) + 1 : end_;
            return absl::OkStatus();
          }
        }
        // A window from `pos`; twice the part already seen when the line did not end in it,
        // up to kMaxReadWindow; a line longer than that is scanned through the mapping.
        const uint64_t seen = pos >= win_begin_ && pos < win_end_ ? win_end_ - pos : 0;
        if (seen >= CtfIndexOptions::kMaxReadWindow) break;
        const uint64_t want = std::min({std::max(window_, 2 * seen), CtfIndexOptions::kMaxReadWindow, end_ - pos});
        if (want > capacity_) {
          buf_.reset(new char[want]);
          capacity_ = want;
        }
        win_begin_ = win_end_ = 0;
        if (absl::Status st = read_(pos, want, buf_.get()); !st.ok()) return st;
        win_begin_ = pos;
        win_end_ = pos + want;
      }
    }
    const char* nl = static_cast<const char*>(std::memchr(base_ + pos, '\n', end_ - pos));
    *text = base_ + pos;
    *eol = nl != nullptr ? static_cast<uint64_t>(nl - base_) + 1 : end_;
    return absl::OkStatus();
  }

 private:
  const char* const base_;
  const uint64_t end_;
  const std::function<absl::Status(uint64_t, uint64_t, char*)>& read_;
  const uint64_t window_;
  std::unique_ptr<char[]> buf_;
  uint64_t capacity_ = 0, win_begin_ = 0, win_end_ = 0;
};

inline bool IsBlankChar(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// True when `line` carries `|alias` followed by a delimiter, '|', a control char or its end.
bool HasStream(std::string_view line, std::string_view needle /* "|alias" */) {
  size_t pos = 0;
  while ((pos = line.find(needle, pos)) != std::string_view::npos) {
    size_t after = pos + needle.size();
    if (after >= line.size()) return true;
    unsigned char c = static_cast<unsigned char>(line[after]);
    if (c == ' ' || c == '|' || c < 0x20) return true;
    pos = after;
  }
  return false;
}

void ScanRange(std::string_view bytes, uint64_t begin, uint64_t end, bool per_line,
               const std::string& needle, std::atomic<uint64_t>* scanned,
               const CtfIndexOptions& options, RangeResult* out) {
  const std::function<void(uint64_t)>& progress = options.progress;
  RangeLines lines(bytes, options, end);
  uint64_t pos = begin;
  uint64_t line = 0;
  bool current_known = false;
  uint64_t current_id = 0;
  uint64_t pending_blanks = 0;
  uint64_t reported = begin;
  while (pos < end) {
    const char* start = nullptr;
    uint64_t eol = 0;
    if (absl::Status st = lines.Line(pos, &start, &eol); !st.ok()) {
      out->read_error = st;
      return;
    }
    std::string_view text(start, eol - pos);
    uint64_t i = 0;
    while (i < text.size() && IsBlankChar(text[i])) ++i;
    const bool blank = i == text.size() || text[i] == '\n';
    if (blank) {
      if (out->blank_lines.size() < IndexErrors::kMaxKept) out->blank_lines.push_back(line);
      ++pending_blanks;
    } else {
      out->inner_blanks += pending_blanks;
      pending_blanks = 0;
      bool has_id = false;
      uint64_t id = 0;
      if (!per_line && text[0] >= '0' && text[0] <= '9') {
        has_id = true;
        uint64_t j = 0;
        for (; j < text.size() && text[j] >= '0' && text[j] <= '9'; ++j) {
          if (j >= 19) {
            out->error = "sequence id longer than 19 digits";
            out->error_line = line;
            return;
          }
          id = id * 10 + static_cast<uint64_t>(text[j] - '0');
        }
      }
      const bool counts = needle.empty() || HasStream(text, needle);
      if (per_line) {
        if (counts) {
          SequenceEntry s;
          s.key = line;  // made absolute by the merge
          s.offset = pos;
          s.line = line;
          s.size = static_cast<uint32_t>(eol - pos);
          s.num_samples = 1;
          out->sequences.push_back(s);
        }
      } else {
        // A new sequence starts at the range's first row and at every id that differs from
        // the current sequence's. The first row of a range without id continues the previous
        // range's last sequence, whose id is unknown here: the merge resolves it.
        bool starts_new;
        if (!out->any_content) {
          out->first_has_id = has_id;
          out->first_id = id;
          starts_new = true;
          current_known = has_id;
        } else if (has_id && !current_known) {
          starts_new = true;
          out->second_may_continue = out->sequences.size() == 1;
          current_known = true;
        } else {
          starts_new = has_id && id != current_id;
        }
        if (starts_new) {
          SequenceEntry s;
          s.key = id;
          s.offset = pos;
          s.line = line;
          out->sequences.push_back(s);
          if (has_id) current_id = id;
        }
        SequenceEntry& cur = out->sequences.back();
        if (eol - cur.offset >= (1ull << 32)) {
          out->error = "a sequence of 4 GiB or more";
          out->error_line = cur.line;
          return;
        }
        cur.size = static_cast<uint32_t>(eol - cur.offset);
        cur.num_samples += counts ? 1 : 0;
      }
      out->any_content = true;
    }
    ++line;
    pos = eol;
    if (progress && pos - reported >= (8u << 20)) {
      progress(scanned->fetch_add(pos - reported) + (pos - reported));
      reported = pos;
    }
  }
  if (progress) progress(scanned->fetch_add(pos - reported) + (pos - reported));
  out->trailing_blanks = pending_blanks;
  out->lines = line;
}

// Lines in [begin, end), estimated from three 64 KiB samples (its start, middle and end), a
// sixteenth over. Per-line mode makes a record of every line: reserving them up front spares
// the vector's doubling chain its copies and page faults, a third of the time on a file of
// short lines (bench/RESULTS.md). A wrong guess costs one reallocation (too few) or address
// space never touched (too many).
uint64_t EstimateLines(std::string_view bytes, uint64_t begin, uint64_t end) {
  constexpr uint64_t kPiece = 64u << 10;
  const char* base = bytes.data();
  const uint64_t n = end - begin;
  if (n <= 3 * kPiece) return static_cast<uint64_t>(std::count(base + begin, base + end, '\n')) + 1;
  uint64_t lines = 0;
  for (const uint64_t at : {begin, begin + n / 2 - kPiece / 2, end - kPiece})
    lines += static_cast<uint64_t>(std::count(base + at, base + at + kPiece, '\n'));
  return static_cast<uint64_t>(static_cast<double>(lines) * static_cast<double>(n) / (3 * kPiece) * 17 / 16) + 1024;
}

}  // namespace

uint64_t CtfIndexConfigHash(const CtfIndexOptions& options) {
  std::string key = absl::StrCat("ctf-index-v1|", options.skip_sequence_ids ? 1 : 0, "|",
                                 options.main_alias);
  return Hash64(key.data(), key.size());
}

absl::StatusOr<Index> BuildCtfIndex(std::string_view bytes, const std::string& path,
                                    const CtfIndexOptions& options) {
  Index index;
  index.file_size = bytes.size();
  uint64_t start = 0;
  if (bytes.size() >= 2 && ((bytes[0] == '\xFF' && bytes[1] == '\xFE') ||
                            (bytes[0] == '\xFE' && bytes[1] == '\xFF'))) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ":1:1: found a UTF-16 byte-order mark; expected UTF-8 or ASCII text (convert the file with iconv)"));
  }
  if (bytes.size() >= 3 && bytes.substr(0, 3) == "\xEF\xBB\xBF") start = 3;
  // Per-line mode: skipSequenceIds, or the first non-space character is '|'.
  uint64_t first = start;
  while (first < bytes.size() && (IsBlankChar(bytes[first]) || bytes[first] == '\n')) ++first;
  const bool per_line = options.skip_sequence_ids || (first < bytes.size() && bytes[first] == '|');
  index.keys_are_line_numbers = per_line;
  const std::string needle = options.main_alias.empty() ? "" : "|" + options.main_alias;

  int threads = options.threads > 0 ? options.threads
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t size = bytes.size();
  // Ranges of at least 4 MiB: below that threads cost more than they save.
  const uint64_t min_range = 4u << 20;
  threads = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(threads, (size - start) / min_range)));
  std::vector<uint64_t> bounds{start};
  for (int t = 1; t < threads; ++t) {
    uint64_t b = start + (size - start) * t / threads;
    const char* nl = static_cast<const char*>(std::memchr(bytes.data() + b, '\n', size - b));
    b = nl ? static_cast<uint64_t>(nl - bytes.data()) + 1 : size;
    if (b > bounds.back()) bounds.push_back(b);
  }
  bounds.push_back(size);
  const size_t nr = bounds.size() - 1;
  std::vector<RangeResult> results(nr);
  if (per_line) {
    // Range 0's vector becomes the index's (the merge appends the others to it): it reserves
    // for the whole file.
    uint64_t all = 0;
    for (size_t r = 0; r < nr; ++r) {
      const uint64_t lines = EstimateLines(bytes, bounds[r], bounds[r + 1]);
      all += lines;
      if (r > 0) results[r].sequences.reserve(lines);
    }
    results[0].sequences.reserve(all);
  }
  std::atomic<uint64_t> scanned{0};
  if (nr == 1) {
    ScanRange(bytes, bounds[0], bounds[1], per_line, needle, &scanned, options, &results[0]);
  } else {
    std::vector<std::thread> pool;
    for (size_t r = 0; r < nr; ++r) {
      pool.emplace_back(ScanRange, bytes, bounds[r], bounds[r + 1], per_line, std::cref(needle),
                        &scanned, std::cref(options), &results[r]);
    }
    for (auto& t : pool) t.join();
  }

  // Merge in order, making lines absolute and joining sequences across range boundaries.
  uint64_t line_base = 0;
  uint64_t pending_blanks = 0;
  std::vector<uint64_t> blank_lines;
  size_t total = 0;
  for (const auto& r : results) total += r.sequences.size();
  for (size_t r = 0; r < nr; ++r) {
    RangeResult& res = results[r];
    if (!res.read_error.ok()) return res.read_error;
    if (!res.error.empty()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_base + res.error_line + 1, ":1: ", res.error));
    }
    for (uint64_t l : res.blank_lines) blank_lines.push_back(line_base + l);
    if (res.any_content) {
      index.errors.count += pending_blanks + res.inner_blanks;
      pending_blanks = res.trailing_blanks;
    } else {
      pending_blanks += res.trailing_blanks;
    }
    if (r == 0) {
      // The first range's lines and keys are already absolute: its records are taken, not copied.
      index.sequences.swap(res.sequences);
      index.sequences.reserve(total);
      line_base += res.lines;
      continue;
    }
    size_t k = 0;
    if (!per_line && !res.sequences.empty() && !index.sequences.empty()) {
      // Joins res.sequences[k] into the last merged sequence when it continues it.
      auto join = [&](const SequenceEntry& s) -> absl::Status {
        SequenceEntry& prev = index.sequences.back();
        const uint64_t new_size = s.offset + s.size - prev.offset;
        if (new_size >= (1ull << 32)) {
          return absl::DataLossError(absl::StrCat(path, ":", prev.line + 1, ":1: a sequence of 4 GiB or more"));
        }
        prev.size = static_cast<uint32_t>(new_size);
        prev.num_samples += s.num_samples;
        return absl::OkStatus();
      };
      const uint64_t prev_key = index.sequences.back().key;
      if (!res.first_has_id || res.first_id == prev_key) {
        absl::Status st = join(res.sequences[0]);
        if (!st.ok()) return st;
        k = 1;
        if (!res.first_has_id && res.second_may_continue && res.sequences.size() > 1 &&
            res.sequences[1].key == prev_key) {
          st = join(res.sequences[1]);
          if (!st.ok()) return st;
          k = 2;
        }
      }
    }
    for (; k < res.sequences.size(); ++k) {
      SequenceEntry s = res.sequences[k];
      s.line += line_base;
      if (per_line) s.key = s.line;
      index.sequences.push_back(s);
    }
    line_base += res.lines;
  }
  // Trailing blank lines at the end of the file are not errors.
  std::vector<IndexError> found;
  for (uint64_t l : blank_lines) {
    if (pending_blanks > 0 && l >= line_base - pending_blanks) break;
    found.push_back({IndexError::kBlankRow, l, 0, 0});
  }
  // Ids may repeat only on consecutive lines: a later sequence reusing an id is an input
  // error and is left out. Ids that only grow need no check (the common case).
  if (!per_line) {
    bool increasing = true;
    for (size_t i = 1; i < index.sequences.size() && increasing; ++i)
      increasing = index.sequences[i].key > index.sequences[i - 1].key;
    if (!increasing) {
      std::vector<std::pair<uint64_t, uint64_t>> by_key(index.sequences.size());  // (key, position)
      for (size_t i = 0; i < by_key.size(); ++i) by_key[i] = {index.sequences[i].key, i};
      std::sort(by_key.begin(), by_key.end());
      std::vector<bool> repeated(index.sequences.size(), false);
      std::vector<uint64_t> first_line_of(index.sequences.size(), 0);
      for (size_t i = 1; i < by_key.size(); ++i) {
        if (by_key[i].first != by_key[i - 1].first) continue;
        size_t head = i - 1;
        while (head > 0 && by_key[head - 1].first == by_key[i].first) --head;
        repeated[by_key[i].second] = true;
        first_line_of[by_key[i].second] = index.sequences[by_key[head].second].line;
      }
      HugeVector<SequenceEntry> kept;
      kept.reserve(index.sequences.size());
      for (size_t i = 0; i < index.sequences.size(); ++i) {
        if (repeated[i]) {
          index.errors.count += 1;
          found.push_back({IndexError::kRepeatedId, index.sequences[i].line, first_line_of[i], index.sequences[i].key});
        } else {
          kept.push_back(index.sequences[i]);
        }
      }
      index.sequences.swap(kept);
    }
  }
  std::sort(found.begin(), found.end(), [](const IndexError& x, const IndexError& y) { return x.line < y.line; });
  if (found.size() > IndexErrors::kMaxKept) found.resize(IndexErrors::kMaxKept);
  index.errors.first = std::move(found);
  // A definesMBSize stream absent from a whole sequence: the sequence is not indexed (CNTK).
  if (!needle.empty()) {
    index.sequences.erase(std::remove_if(index.sequences.begin(), index.sequences.end(),
                                         [](const SequenceEntry& s) { return s.num_samples == 0; }),
                          index.sequences.end());
  }
  index.BuildChunks(options.chunk_size);
  return index;
}

}  // namespace conveyor
