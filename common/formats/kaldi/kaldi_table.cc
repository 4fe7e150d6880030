#include "common/formats/kaldi/kaldi_table.h"

#include <charconv>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_path.h"
#include "common/status_macros.h"
#include "common/text_lines.h"

namespace conveyor::kaldi {
namespace {



std::string Printable(std::string_view s, size_t max = 40) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) out.push_back(static_cast<char>(c));
    else absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
  }
  if (s.size() > max) out += "...";
  return out;
}

bool ParseIndex(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// A pipe: `cmd |` (trailing whitespace allowed).
bool IsPipe(std::string_view rx) {
  rx = TrimCSpace(rx);
  return !rx.empty() && rx.back() == '|';
}

// `file:offset` -> (file, offset); false when there is no numeric suffix.
bool SplitOffset(std::string_view rx, std::string_view* file, uint64_t* offset) {
  const size_t colon = rx.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == rx.size() || colon == 0) return false;
  std::string_view digits = rx.substr(colon + 1);
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), *offset);
  if (r.ec != std::errc()) return false;
  *file = rx.substr(0, colon);
  return true;
}

}  // namespace

absl::StatusOr<Rspecifier> ParseRspecifier(std::string_view spec) {
  Rspecifier r;
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("rspecifier '", AV(spec), "': expected 'ark:' or 'scp:' (with options, e.g. 'scp,p:') before the file name"));
  }
  int kinds = 0;
  for (absl::string_view ao : absl::StrSplit(AV(spec.substr(0, colon)), ',')) {
    std::string_view o = TrimCSpace(std::string_view(ao.data(), ao.size()));
    if (o == "ark") r.scp = false, ++kinds;
    else if (o == "scp") r.scp = true, ++kinds;
    else if (o == "o") r.once = true;
    else if (o == "no") r.once = false;
    else if (o == "s") r.sorted = true;
    else if (o == "ns") r.sorted = false;
    else if (o == "cs") r.called_sorted = true;
    else if (o == "ncs") r.called_sorted = false;
    else if (o == "p") r.permissive = true;
    else if (o == "np") r.permissive = false;
    else if (o == "b") r.binary = true;
    else if (o == "t") r.text = true;
    else if (o == "bg") r.background = true;
    else {
      return absl::InvalidArgumentError(absl::StrCat("rspecifier '", AV(spec), "': unknown option '", AV(o),
                                                     "' (expected ark or scp and any of o, s, cs, p, b, t, bg, no, ns, ncs, np)"));
    }
  }
  if (kinds != 1) {
    return absl::InvalidArgumentError(absl::StrCat("rspecifier '", AV(spec), "': expected exactly one of 'ark' and 'scp' before ':'"));
  }
  r.rxfilename = std::string(TrimCSpace(spec.substr(colon + 1)));
  if (r.rxfilename.empty()) return absl::InvalidArgumentError(absl::StrCat("rspecifier '", AV(spec), "' has no file name"));
  if (r.rxfilename == "-") {
    return absl::InvalidArgumentError(absl::StrCat("rspecifier '", AV(spec), "': standard input ('-') cannot be read by a daemon; name a file"));
  }
  return r;
}

absl::StatusOr<MatrixRange> ParseMatrixRange(std::string_view inside) {
  std::vector<std::string_view> parts;
  for (absl::string_view a : absl::StrSplit(AV(inside), ',')) parts.emplace_back(a.data(), a.size());
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("invalid range '[", AV(inside), "]': ", AV(why),
                                                   " (expected [r1:r2], [r1:r2,c1:c2], [:,c1:c2] or [,c1:c2], ends inclusive)"));
  };
  if (parts.size() > 2) return bad("more than two parts");
  MatrixRange r;
  auto part = [&](std::string_view p, bool* all, int64_t* a, int64_t* b, bool empty_ok) -> absl::Status {
    if (p == ":" || (empty_ok && p.empty())) {
      *all = true;
      return absl::OkStatus();
    }
    const size_t colon = p.find(':');
    if (colon == std::string_view::npos) return bad(absl::StrCat("'", AV(p), "' is not a:b"));
    if (!ParseIndex(p.substr(0, colon), a) || !ParseIndex(p.substr(colon + 1), b))
      return bad(absl::StrCat("'", AV(p), "' needs two non-negative integers a:b"));
    if (*a > *b) return bad(absl::StrCat("'", AV(p), "' ends before it starts"));
    *all = false;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(part(parts[0], &r.all_rows, &r.r0, &r.r1, parts.size() == 2));
  if (parts.size() == 2) RETURN_IF_ERROR(part(parts[1], &r.all_cols, &r.c0, &r.c1, false));
  return r;
}

absl::StatusOr<Window> ApplyRange(const MatrixRange& range, int64_t rows, int64_t cols, bool* clamped) {
  *clamped = false;
  Window w{0, rows, 0, cols};
  if (rows == 0) return absl::InvalidArgumentError("a range cannot select from an empty matrix");
  if (!range.all_rows) {
    if (range.r1 >= rows + 3 || range.r0 >= rows) {
      return absl::InvalidArgumentError(absl::StrCat("row range ", range.r0, ":", range.r1, " is outside the matrix's ", rows, " rows"));
    }
    int64_t r1 = range.r1;
    if (r1 > rows - 1) r1 = rows - 1, *clamped = true;
    w.row0 = range.r0;
    w.rows = r1 - range.r0 + 1;
  }
  if (!range.all_cols) {
    if (range.c1 >= cols) {
      return absl::InvalidArgumentError(absl::StrCat("column range ", range.c0, ":", range.c1, " is outside the matrix's ", cols, " columns"));
    }
    w.col0 = range.c0;
    w.cols = range.c1 - range.c0 + 1;
  }
  return w;
}

uint64_t KaldiTable::total_bytes() const {
  uint64_t n = 0;
  for (const Source& s : sources_) n += s.bytes.size();
  return n;
}

void KaldiTable::WillNeed(size_t i) const {
  const TableEntry& e = entries_[i];
  if (sources_[e.source].file) sources_[e.source].file->WillNeed(e.offset, e.info.size);
}

absl::StatusOr<uint32_t> KaldiTable::SourceFor(const std::string& rx, const std::string& scp_dir) {
  for (uint32_t i = 0; i < sources_.size(); ++i)
    if (sources_[i].name == rx) return i;
  Source s;
  if (IsPipe(rx)) {
    std::string cmd(TrimCSpace(rx));
    cmd.pop_back();
    if (!allow_pipes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", rx, "' is a command; the daemon runs no command a data file names unless the config says allowPipes: true"));
    }
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return absl::InternalError(absl::StrCat("cannot run '", cmd, "'"));
    char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) s.owned.append(buf, got);
    const int rc = ::pclose(p);
    if (rc != 0) return absl::DataLossError(absl::StrCat("command '", cmd, "' exited with status ", rc));
    s.name = rx;
    sources_.push_back(std::move(s));
    sources_.back().bytes = sources_.back().owned;
    return static_cast<uint32_t>(sources_.size() - 1);
  }
  // docs/formats.md, "Kaldi tables": a relative rxfilename is looked for in the
  // configuration's directory, then (named by an scp file) in the scp file's directory.
  std::vector<std::string> dirs{base_dir_};  // "": the working directory
  if (!scp_dir.empty() && scp_dir != base_dir_) dirs.push_back(scp_dir);
  const std::string path = ResolveAgainst(rx, dirs);
  for (uint32_t i = 0; i < sources_.size(); ++i)
    if (sources_[i].name == path) return i;
  ASSIGN_OR_RETURN(s.file, MappedFile::Open(path));
  s.name = path;
  s.bytes = s.file->bytes();
  sources_.push_back(std::move(s));
  return static_cast<uint32_t>(sources_.size() - 1);
}

absl::StatusOr<std::unique_ptr<KaldiTable>> KaldiTable::Open(const std::string& rspecifier, const TableOptions& options) {
  std::unique_ptr<KaldiTable> t(new KaldiTable);
  ASSIGN_OR_RETURN(t->spec_, ParseRspecifier(rspecifier));
  t->allow_pipes_ = options.allow_pipes;
  t->base_dir_ = options.base_dir;
  if (t->spec_.scp) {
    if (IsPipe(t->spec_.rxfilename)) {
      return absl::InvalidArgumentError(absl::StrCat("rspecifier '", rspecifier, "': an scp file must be a file"));
    }
    std::string path = t->spec_.rxfilename;
    path = JoinPath(options.base_dir, path);
    RETURN_IF_ERROR(t->ReadScp(path, options));
  } else {
    std::string_view file;
    uint64_t offset;
    if (!IsPipe(t->spec_.rxfilename) && SplitOffset(t->spec_.rxfilename, &file, &offset)) {
      return absl::InvalidArgumentError(absl::StrCat("rspecifier '", rspecifier, "': an archive is read from its start (no ':offset')"));
    }
    ASSIGN_OR_RETURN(uint32_t src, t->SourceFor(t->spec_.rxfilename, ""));
    RETURN_IF_ERROR(t->ReadArchive(src, options));
  }
  if (t->spec_.sorted) {
    for (size_t i = 1; i < t->entries_.size(); ++i) {
      if (t->entries_[i].key < t->entries_[i - 1].key) {
        return absl::InvalidArgumentError(absl::StrCat("rspecifier '", rspecifier, "' says the keys are sorted (s), but '",
                                                       t->entries_[i].key, "' follows '", t->entries_[i - 1].key, "'"));
      }
    }
  }
  return t;
}

absl::StatusOr<std::unique_ptr<KaldiTable>> KaldiTable::OpenArchiveBytes(std::string bytes, const std::string& name,
                                                                          const TableOptions& options) {
  std::unique_ptr<KaldiTable> t(new KaldiTable);
  Source s;
  s.name = name;
  s.owned = std::move(bytes);
  t->sources_.push_back(std::move(s));
  t->sources_.back().bytes = t->sources_.back().owned;
  RETURN_IF_ERROR(t->ReadArchive(0, options));
  return t;
}

absl::Status KaldiTable::ReadArchive(uint32_t src, const TableOptions& options) {
  const std::string_view bytes = sources_[src].bytes;
  const std::string& name = sources_[src].name;
  const uint64_t n = bytes.size();
  uint64_t pos = 0, reported = 0;
  while (true) {
    while (pos < n && IsCSpace(bytes[pos])) ++pos;
    if (pos >= n) break;
    const uint64_t key_begin = pos;
    while (pos < n && !IsCSpace(bytes[pos])) ++pos;
    std::string key(bytes.substr(key_begin, pos - key_begin));
    if (pos >= n) {
      // Kaldi reads a key that ends the file as a clean end of the archive.
      if (options.warn) {
        options.warn(absl::StrCat(name, ": byte ", key_begin, ": '", Printable(key),
                                  "' at the end of the archive has no object; ignored (as Kaldi does)"));
      }
      break;
    }
    absl::Status error;
    if (bytes[pos] == ' ' || bytes[pos] == '\t') {
      ++pos;
    } else if (bytes[pos] != '\n') {
      error = absl::DataLossError(absl::StrCat("byte ", pos, ": expected a space after the key '", Printable(key), "'"));
    }
    if (error.ok()) {
      auto info = ScanObject(bytes, pos, options.kind);
      if (info.ok()) {
        TableEntry e;
        e.key = std::move(key);
        e.source = src;
        e.offset = pos;
        e.info = *info;
        e.window = {0, info->rows, 0, info->cols};
        entries_.push_back(std::move(e));
        pos += info->size;
        if (options.progress && pos - reported > (8u << 20)) {
          options.progress(pos, n);
          reported = pos;
        }
        continue;
      }
      error = info.status();
    }
    const std::string message = absl::StrCat(name, ": ", error.message(), " (entry '", Printable(key), "')");
    if (spec_.permissive || (options.tolerate && options.tolerate(message))) {
      if (options.warn) options.warn(absl::StrCat(message, "; the rest of the archive (", n - key_begin, " bytes) is skipped"));
      ++skipped_;
      break;
    }
    return absl::DataLossError(message);
  }
  if (options.progress) options.progress(n, n);
  return absl::OkStatus();
}

absl::Status KaldiTable::ReadScp(const std::string& path, const TableOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> scp, MappedFile::Open(path));
  const std::string scp_dir = ParentDir(path);
  uint64_t unopened = 0;  // entries whose file could not be opened
  std::string first_unopened;
  std::string_view text = scp->bytes();
  LineReader lines(text);
  std::string_view raw;
  while (lines.Next(&raw)) {
    const uint64_t line_no = lines.line_no();
    auto fail = [&](const std::string& why) -> absl::Status {
      const std::string message = absl::StrCat(path, ":", line_no, ": ", why);
      if (spec_.permissive || (options.tolerate && options.tolerate(message))) {
        if (options.warn) options.warn(absl::StrCat(message, "; line skipped"));
        ++skipped_;
        return absl::OkStatus();
      }
      return absl::DataLossError(message);
    };
    const std::string_view line = TrimCSpace(raw);
    if (line.empty()) {
      RETURN_IF_ERROR(fail("empty line (expected 'KEY RXFILENAME')"));
      continue;
    }
    size_t sp = 0;
    while (sp < line.size() && !IsCSpace(line[sp])) ++sp;
    const std::string key(line.substr(0, sp));
    std::string_view rx = TrimCSpace(line.substr(sp));
    if (rx.empty()) {
      RETURN_IF_ERROR(fail(absl::StrCat("key '", Printable(key), "' has no rxfilename")));
      continue;
    }
    bool has_range = false;
    MatrixRange range;
    const size_t open = rx.find('[');
    if (open != std::string_view::npos && !IsPipe(rx)) {
      if (rx.back() != ']') {
        RETURN_IF_ERROR(fail(absl::StrCat("range '", AV(rx.substr(open)), "' has no closing ']'")));
        continue;
      }
      if (rx.find('[', open + 1) != std::string_view::npos) {
        RETURN_IF_ERROR(fail(absl::StrCat("'", AV(rx), "' has more than one '['")));
        continue;
      }
      auto parsed = ParseMatrixRange(rx.substr(open + 1, rx.size() - open - 2));
      if (!parsed.ok()) {
        RETURN_IF_ERROR(fail(std::string(parsed.status().message())));
        continue;
      }
      if (options.kind != ObjectKind::kMatrix) {
        RETURN_IF_ERROR(fail("ranges are only supported for matrices"));
        continue;
      }
      range = *parsed;
      has_range = true;
      rx = rx.substr(0, open);
    }
    std::string_view file = rx;
    uint64_t offset = 0;
    if (!IsPipe(rx)) SplitOffset(rx, &file, &offset);
    if (file == "-") {
      RETURN_IF_ERROR(fail("standard input ('-') cannot be read by a daemon"));
      continue;
    }
    auto src = SourceFor(std::string(file), scp_dir);
    if (!src.ok()) {
      if (unopened++ == 0) first_unopened = std::string(src.status().message());
      RETURN_IF_ERROR(fail(std::string(src.status().message())));
      continue;
    }
    const std::string_view bytes = sources_[*src].bytes;
    if (offset > bytes.size()) {
      RETURN_IF_ERROR(fail(absl::StrCat("offset ", offset, " is past the end of ", sources_[*src].name, " (", bytes.size(), " bytes)")));
      continue;
    }
    auto info = ScanObject(bytes, offset, options.kind);
    if (!info.ok()) {
      RETURN_IF_ERROR(fail(absl::StrCat(sources_[*src].name, ": ", info.status().message(), " (entry '", Printable(key), "')")));
      continue;
    }
    TableEntry e;
    e.key = key;
    e.source = *src;
    e.offset = offset;
    e.info = *info;
    e.window = {0, info->rows, 0, info->cols};
    if (has_range) {
      bool clamped = false;
      auto w = ApplyRange(range, info->rows, info->cols, &clamped);
      if (!w.ok()) {
        RETURN_IF_ERROR(fail(absl::StrCat("key '", Printable(key), "': ", w.status().message())));
        continue;
      }
      if (clamped && options.warn) {
        options.warn(absl::StrCat(path, ":", line_no, ": row range of '", key, "' ends past its ", info->rows,
                                  " rows; clamped to the last row (as Kaldi does)"));
      }
      e.window = *w;
    }
    entries_.push_back(std::move(e));
    if (options.progress && (line_no & 1023) == 0) options.progress(lines.offset(), text.size());
  }
  if (options.progress) options.progress(text.size(), text.size());
  // The scp's mapping goes when this returns: a read of it past the end of a file cut short
  // meanwhile is reported now (MappedFile::CheckReads), not parsed as zeros.
  RETURN_IF_ERROR(MappedFile::CheckReads({scp->path()}));
  if (entries_.empty() && unopened > 0) {
    // Every file the table names is missing: a path rule, not bad data; one error says which.
    return absl::NotFoundError(absl::StrCat(
        path, ": none of the files its entries name could be opened (", unopened, " entries; the first: ",
        first_unopened, "). A relative file name in an scp file is looked for in the configuration's directory ('",
        base_dir_.empty() ? "." : base_dir_, "'), then in the scp file's ('", scp_dir.empty() ? "." : scp_dir,
        "'): give absolute paths, or put the configuration where the scp's paths start"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::kaldi
