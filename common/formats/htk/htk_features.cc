// htk_features.cc: the HTKFeature deserializer (htk_features.h).
#include "common/formats/htk/htk_features.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/chunk/compressed.h"
#include "common/file_path.h"
#include "common/formats/htk/htk_common.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "common/text_lines.h"

namespace conveyor {
namespace {

using htk::Load;
using htk::ParseInt;
using htk::StripExtension;

constexpr uint16_t kCompressed = 02000, kVq = 040000, kBaseMask = 077, kFeStream = 12;

}  // namespace

absl::StatusOr<HtkHeader> ParseHtkHeader(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 12) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(), " bytes; an HTK file starts with a 12-byte header"));
  }
  HtkHeader h;
  // HTK writes big-endian; CNTK also reads files written little-endian, telling them apart by
  // the sample period that makes more sense (the smaller one).
  const uint32_t be_period = Load<uint32_t>(bytes.data() + 4, true), le_period = Load<uint32_t>(bytes.data() + 4, false);
  h.big_endian = be_period <= le_period;
  h.samples = Load<int32_t>(bytes.data(), h.big_endian);
  h.period = Load<int32_t>(bytes.data() + 4, h.big_endian);
  h.sample_bytes = Load<int16_t>(bytes.data() + 8, h.big_endian);
  h.kind = Load<uint16_t>(bytes.data() + 10, h.big_endian);
  h.compressed = (h.kind & kCompressed) != 0;
  auto bad = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": HTK header: ", why)); };
  if (h.kind & kVq) return bad("vector-quantised (_V) files are not supported");
  if ((h.kind & kBaseMask) == kFeStream) return bad("FESTREAM files are not supported");
  if (h.samples < 0) return bad(absl::StrCat("negative sample count ", h.samples));
  if (h.sample_bytes <= 0 || h.sample_bytes % (h.compressed ? 2 : 4) != 0) {
    return bad(absl::StrCat("sample size ", h.sample_bytes, " bytes is not a whole number of ",
                            h.compressed ? "int16 (_C)" : "float32", " values"));
  }
  h.dim = h.sample_bytes / (h.compressed ? 2 : 4);
  h.frames = h.samples;
  if (h.compressed) {
    // The A and B vectors (dim floats each) take the room of 4 compressed frames.
    if (h.samples < 4) return bad(absl::StrCat("a compressed (_C) file needs at least 4 samples for its A and B vectors, has ", h.samples));
    h.frames = h.samples - 4;
    h.data_offset = 12 + 8 * static_cast<uint64_t>(h.dim);
  }
  const uint64_t need = h.data_offset + static_cast<uint64_t>(h.frames) * static_cast<uint64_t>(h.sample_bytes);
  if (need > bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: the header promises ", h.frames, " frames of ", h.sample_bytes,
                                            " bytes (", need, " bytes in all), the file has ", bytes.size()));
  }
  return h;
}

absl::StatusOr<HtkScpEntry> ParseHtkScpLine(std::string_view line, const std::string& scp_dir) {
  line = TrimCSpace(line);
  HtkScpEntry e;
  std::string_view logical, physical = line;
  const size_t eq = line.find('=');
  if (eq != std::string_view::npos) {
    logical = line.substr(0, eq);
    physical = line.substr(eq + 1);
  }
  physical = TrimCSpace(physical);
  if (!physical.empty() && physical.back() == ']') {
    const size_t open = physical.rfind('[');
    if (open == std::string_view::npos) return absl::InvalidArgumentError("']' without '['");
    const std::string_view range = physical.substr(open + 1, physical.size() - open - 2);
    const size_t comma = range.find(',');
    if (comma == std::string_view::npos || !ParseInt(TrimCSpace(range.substr(0, comma)), &e.first) ||
        !ParseInt(TrimCSpace(range.substr(comma + 1)), &e.last) || e.first < 0 || e.last < e.first) {
      return absl::InvalidArgumentError(absl::StrCat("bad frame range '[", AV(range), "]' (expected [first,last], inclusive, first <= last)"));
    }
    e.has_range = true;
    physical = TrimCSpace(physical.substr(0, open));
  }
  if (physical.empty()) return absl::InvalidArgumentError("no file name");
  if (physical.substr(0, 4) == ".../") {
    e.path = JoinPath(scp_dir, physical.substr(4));
  } else {
    e.path = std::string(physical);
  }
  e.key = StripExtension(logical.empty() ? physical : TrimCSpace(logical));
  if (e.key.empty()) return absl::InvalidArgumentError("empty utterance id");
  return e;
}

namespace {

// n float32 values at p (any alignment), byte-swapped when big endian, into out. Plain loops
// (the swap as shifts and masks) that the compiler vectorizes, built for AVX2 and the baseline.
#if !defined(__SANITIZE_THREAD__)  // (its ifunc resolver would run before TSan's runtime: a crash at load)
__attribute__((target_clones("avx2", "default")))
#endif
void LoadFloats(const char* __restrict p, size_t n, bool big_endian, float* __restrict out) {
  if (!big_endian) {
    std::memcpy(out, p, n * sizeof(float));
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, p + 4 * j, 4);
    u = (u >> 24) | ((u >> 8) & 0xff00u) | ((u << 8) & 0xff0000u) | (u << 24);
    std::memcpy(out + j, &u, 4);
  }
}

void LoadFloats(const char* p, size_t n, bool big_endian, double* out) {
  float block[256];
  for (size_t at = 0; at < n; at += 256) {
    const size_t k = std::min<size_t>(256, n - at);
    LoadFloats(p + 4 * at, k, big_endian, block);
    for (size_t j = 0; j < k; ++j) out[at + j] = block[j];
  }
}

// Values [j0, j0 + n) of frame f of `p` (uncompressed, n may run on into the frames after it):
// float32 swapped when big-endian, or _C's int16 x as (x + B) / A, in float as HTK defines.
template <typename T>
void LoadFrameValues(const char* file, const HtkFramesPayload& p, int64_t f, uint64_t j0, size_t n, T* out) {
  if (!p.compressed) {
    LoadFloats(file + p.first + (static_cast<uint64_t>(f) * p.dim + j0) * 4, n, p.big_endian, out);
    return;
  }
  const char* x = file + p.first + (static_cast<uint64_t>(f) * p.dim + j0) * 2;
  const char* a = file + 12 + uint64_t{4} * j0;
  const char* b = a + uint64_t{4} * p.dim;
  for (size_t j = 0; j < n; ++j) {
    const float v = static_cast<float>(Load<int16_t>(x + 2 * j, p.big_endian));
    out[j] = static_cast<T>((v + Load<float>(b + 4 * j, p.big_endian)) / Load<float>(a + 4 * j, p.big_endian));
  }
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of an utterance's windows: row t is
// frames t - left .. t + right (the edge frames repeated), dim values each.
template <typename T>
void DecodeFrames(const char* file, const CompressedHeader& header, const CompressedWindow& w, T* out) {
  const HtkFramesPayload p = header.Load<HtkFramesPayload>();
  const int64_t width = p.left + 1 + p.right;
  const uint64_t row_values = static_cast<uint64_t>(width) * p.dim;
  const bool whole_rows = w.col0 == 0 && static_cast<uint64_t>(w.cols) == row_values;
  if (whole_rows && width == 1 && !p.compressed) {  // no window: the rows lie back to back
    LoadFrameValues(file, p, w.row0, 0, static_cast<size_t>(w.rows) * p.dim, out);
    return;
  }
  for (int64_t t = w.row0; t < w.row0 + w.rows; ++t, out += w.cols) {
    if (whole_rows && !p.compressed && t - p.left >= 0 && t + p.right < p.frames) {
      LoadFrameValues(file, p, t - p.left, 0, row_values, out);  // frames back to back
      continue;
    }
    for (int64_t k = 0; k < width; ++k) {  // frame t - left + k: columns [k * dim, (k + 1) * dim)
      const int64_t c0 = std::max<int64_t>(w.col0, k * p.dim), c1 = std::min<int64_t>(w.col0 + w.cols, (k + 1) * p.dim);
      if (c0 >= c1) continue;
      const int64_t f = std::min(std::max<int64_t>(t - p.left + k, 0), p.frames - 1);
      LoadFrameValues(file, p, f, static_cast<uint64_t>(c0 - k * p.dim), static_cast<size_t>(c1 - c0), out + (c0 - w.col0));
    }
  }
}


}  // namespace

uint32_t HtkFramesCodecTag() {
  static const uint32_t tag =
      RegisterCompressedCodec(CompressedCodec{"HTKFeatures", &DecodeFrames<float>, &DecodeFrames<double>});
  return tag;
}

namespace {

class HtkFeatureSource final : public Deserializer {
 public:
  struct File {
    std::string path;
    std::unique_ptr<MappedFile> map;
    HtkHeader header;
  };
  struct Entry {
    std::string key;
    uint32_t file = 0;
    int64_t first = 0, frames = 0;
  };

  absl::Status Open(const DeserializerConfig& d, const std::string& base_dir, Diagnostics* diag, ErrorBudget* budget) {
    streams_ = d.streams;
    if (streams_.size() != 1) return absl::InvalidArgumentError("an HTKFeature deserializer has exactly one input (add another deserializer for more)");
    StreamConfig& sc = streams_[0];
    scp_ = sc.scp_file;
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(scp_));
    const std::string scp_dir = ParentDir(scp_);
    std::map<std::string, uint32_t> by_path;
    std::unordered_map<std::string, int> seen;
    std::vector<Entry> all;
    int64_t feat_dim = -1, kind = -1;
    std::string first_error;
    LineReader lines(text);
    std::string_view raw;
    while (lines.Next(&raw)) {
      const std::string_view line = TrimCSpace(raw);
      const uint64_t line_no = lines.line_no();
      if (line.empty()) continue;
      auto fail = [&](const std::string& why) -> absl::Status {
        const std::string message = absl::StrCat(scp_, ":", line_no, ": ", why);
        if (first_error.empty()) first_error = message;
        if (!budget->Spend()) return absl::DataLossError(absl::StrCat(message, " (more than maxErrors=", budget->max_errors(), " input errors)"));
        diag->Report(Severity::kWarning, "htk scp", absl::StrCat(message, "; line skipped"));
        ++skipped_;
        return absl::OkStatus();
      };
      auto e = ParseHtkScpLine(line, scp_dir);
      if (!e.ok()) {
        RETURN_IF_ERROR(fail(std::string(e.status().message())));
        continue;
      }
      std::string path = e->path;
      // As for Kaldi scp files: the configuration's directory, then the scp file's.
      path = ResolveAgainst(path, {base_dir, scp_dir});
      auto it = by_path.find(path);
      if (it == by_path.end()) {
        auto map = MappedFile::Open(path);
        if (!map.ok()) {
          RETURN_IF_ERROR(fail(std::string(map.status().message())));
          continue;
        }
        auto header = ParseHtkHeader((*map)->bytes(), path);
        if (!header.ok()) {
          RETURN_IF_ERROR(fail(std::string(header.status().message())));
          continue;
        }
        if (feat_dim < 0) feat_dim = header->dim, kind = header->kind & ~kCompressed;
        if (header->dim != feat_dim || (header->kind & ~kCompressed) != kind) {
          RETURN_IF_ERROR(fail(absl::StrCat(path, " has ", header->dim, " values per frame (kind ", header->kind, "), the first file ",
                                            feat_dim, " (kind ", kind, "): every file must match")));
          continue;
        }
        files_.push_back(File{path, std::move(*map), *header});
        it = by_path.emplace(path, static_cast<uint32_t>(files_.size() - 1)).first;
      }
      const HtkHeader& h = files_[it->second].header;
      Entry entry{e->key, it->second, 0, h.frames};
      if (e->has_range) {
        if (e->last >= h.frames) {
          RETURN_IF_ERROR(fail(absl::StrCat("frame range [", e->first, ",", e->last, "] ends past the ", h.frames, " frames of ", path)));
          continue;
        }
        entry.first = e->first;
        entry.frames = e->last - e->first + 1;
      }
      ++seen[entry.key];
      all.push_back(std::move(entry));
    }
    // Repeated keys are all dropped (CNTK): which one was meant is unknowable.
    for (Entry& e : all) {
      if (seen[e.key] > 1) {
        diag->Report(Severity::kWarning, "htk duplicate", absl::StrCat(scp_, ": utterance '", e.key, "' is listed more than once; dropped"));
        ++skipped_;
        continue;
      }
      entries_.push_back(std::move(e));
    }
    if (feat_dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(scp_, ": no readable feature file",
                                                     first_error.empty() ? std::string() : absl::StrCat(" (first problem: ", first_error, ")")));
    }
    feat_dim_ = static_cast<uint32_t>(feat_dim);
    left_ = sc.context_left;
    right_ = sc.context_right;
    if ((left_ < 0) != (right_ < 0)) {  // (a config gives both or neither; a caller of the library may not)
      return absl::InvalidArgumentError(absl::StrCat(scp_, ": input '", sc.name, "' has a context window of ", left_,
                                                     " frames before and ", right_,
                                                     " after: give both (0 or more), or neither to infer it from dim"));
    }
    if (left_ < 0) {
      // Inferred as CNTK does: dim / featDim frames, an odd number.
      const uint64_t dim = sc.dim_given && sc.dim ? sc.dim : feat_dim_;
      if (dim % feat_dim_ != 0 || (dim / feat_dim_) % 2 == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            scp_, ": input '", sc.name, "' has dim ", dim, " but the files have ", feat_dim_,
            " values per frame: dim must be an odd multiple of it (a symmetric context window), or set contextWindow"));
      }
      left_ = right_ = static_cast<int>((dim / feat_dim_ - 1) / 2);
    }
    const uint64_t out_dim = uint64_t{feat_dim_} * static_cast<uint64_t>(left_ + 1 + right_);
    if (sc.dim_given && sc.dim != 0 && sc.dim != out_dim) {
      return absl::InvalidArgumentError(absl::StrCat(scp_, ": input '", sc.name, "' has dim ", sc.dim, " but ", feat_dim_,
                                                     " values per frame x a context window of ", left_ + 1 + right_,
                                                     " frames deliver ", out_dim));
    }
    sc.dim = out_dim;
    return absl::OkStatus();
  }

  const std::vector<StreamConfig>& streams() const override { return streams_; }
  size_t size() const override { return entries_.size(); }
  const std::string& key(size_t i) const override { return entries_[i].key; }
  uint32_t samples(size_t i, size_t) const override { return static_cast<uint32_t>(entries_[i].frames); }
  uint64_t bytes(size_t i) const override {
    return static_cast<uint64_t>(entries_[i].frames) * static_cast<uint64_t>(files_[entries_[i].file].header.sample_bytes);
  }
  uint64_t expansion() const override { return static_cast<uint64_t>(left_ + 1 + right_); }
  void WillNeed(size_t i) const override {
    const Entry& e = entries_[i];
    const File& f = files_[e.file];
    f.map->WillNeed(f.header.data_offset + static_cast<uint64_t>(e.first) * f.header.sample_bytes, bytes(i));
  }
  absl::Status CheckUnchanged(absl::Span<const size_t> entries) const override {
    // An archive of many utterances (in runs): its file once. A file an utterance: a stat(2)
    // each cost about a third of the decode of 300-frame utterances (1.5-2.5 us a call on our
    // VMs, bench/RESULTS.md), so a chunk of many checks 8 of them, spread over the chunk and
    // moved along at every parse (MappedFile::CheckSomeUnchanged): a feature set extracted
    // again over the same paths is caught within a chunk, a single file rewritten among
    // thousands may not be.
    std::vector<const MappedFile*> files;
    uint32_t last = UINT32_MAX;
    for (size_t i : entries) {
      const uint32_t file = entries_[i].file;
      if (file == last) continue;
      last = file;
      files.push_back(files_[file].map.get());
    }
    return MappedFile::CheckSomeUnchanged(&files, &rotation_);
  }
  std::vector<std::string_view> inputs() const override {
    std::vector<std::string_view> out;
    for (const File& f : files_) out.push_back(f.map->bytes());
    return out;
  }
  std::vector<std::string> input_paths() const override {
    std::vector<std::string> out;
    for (const File& f : files_) out.push_back(f.map->path());
    return out;
  }
  std::string description() const override { return scp_; }
  uint64_t skipped() const override { return skipped_; }
  bool aligned_frames() const override { return true; }

  // Entry i's frames left where they lie for the assembler to decode, windows and all (a
  // Dataset opened with compressed_in_place, as the daemon and the CLI's reads do): the chunk
  // holds where they are.
  bool Compressed(size_t i, CompressedDense* m) const override {
    const Entry& e = entries_[i];
    const File& f = files_[e.file];
    HtkFramesPayload p;
    p.first = f.header.data_offset + static_cast<uint64_t>(e.first) * static_cast<uint64_t>(f.header.sample_bytes);
    p.frames = e.frames;
    p.dim = feat_dim_;
    p.left = left_;
    p.right = right_;
    p.big_endian = f.header.big_endian ? 1 : 0;
    p.compressed = f.header.compressed ? 1 : 0;
    m->object = f.map->bytes().data();
    m->info.codec = HtkFramesCodecTag();
    m->info.Store(p);
    m->row0 = 0;
    m->col0 = 0;
    return true;
  }

  // A frame is one load of its (and its window's) bytes, alone or among the utterance's.
  bool CompressedByFrame() const override { return true; }

  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override {
    return precision == Precision::kFloat ? DecodeAs<float>(i, *out[0]) : DecodeAs<double>(i, *out[0]);
  }

 private:
  // Into the chunk (a Dataset not opened with compressed_in_place: `conveyor convert`, the
  // library's default) by the assembler's own decoder, so that both ways give the same values:
  // the chunk's values were reserved for all its windows (Dataset::ParseChunk), and resized
  // without zeroing (HugePageAllocator), every value then written once.
  template <typename T>
  absl::Status DecodeAs(size_t i, ParsedStream& ps) const {
    CompressedDense m;
    Compressed(i, &m);
    const uint64_t frames = static_cast<uint64_t>(entries_[i].frames);
    CompressedWindow w;
    w.rows = static_cast<int64_t>(frames);
    w.cols = static_cast<int64_t>(uint64_t{feat_dim_} * static_cast<uint64_t>(left_ + 1 + right_));
    HugeVector<T>& values = ps.values<T>();
    const size_t at = values.size();
    values.resize(at + frames * static_cast<uint64_t>(w.cols));
    DecodeFrames<T>(m.object, m.info, w, values.data() + at);
    ps.sequence_begin.push_back(ps.sequence_begin.back() + frames);
    return absl::OkStatus();
  }

  std::vector<StreamConfig> streams_;
  std::string scp_;
  std::vector<File> files_;
  mutable std::atomic<uint64_t> rotation_{0};  // where CheckUnchanged() starts in a chunk of many files
  std::vector<Entry> entries_;
  uint32_t feat_dim_ = 0;
  int left_ = 0, right_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenHtkFeatureDeserializer(const DeserializerContext& context) {
  auto s = std::make_unique<HtkFeatureSource>();
  RETURN_IF_ERROR(s->Open(context.config, context.base_dir, context.diagnostics, context.budget));
  return std::unique_ptr<Deserializer>(std::move(s));
}

}  // namespace conveyor
