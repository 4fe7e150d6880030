// mlf.cc: MLF label files and the HTKMLF deserializer (mlf.h).
#include "common/formats/htk/mlf.h"

#include <cstring>
#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"
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

}  // namespace

std::string MlfKey(std::string_view q) {
  q = TrimCSpace(q);
  if (q.size() >= 2 && q.front() == '"' && q.back() == '"') q = q.substr(1, q.size() - 2);
  if (q.substr(0, 2) == "*/") q.remove_prefix(2);
  return StripExtension(q);
}

namespace {

absl::StatusOr<MlfFile> ParseBinaryMlf(std::string_view b, const std::string& path) {
  MlfFile out;
  auto bad = [&](uint64_t at, const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": byte ", at, ": ", why)); };
  if (b.size() < 5) return bad(0, "truncated binary MLF header");
  const int16_t version = Load<int16_t>(b.data() + 3, false);
  if (version != 1 && version != 2) return bad(3, absl::StrCat("binary MLF version ", version, " (expected 1 or 2)"));
  uint64_t at = 5;
  while (at < b.size()) {
    const uint64_t start = at;
    uint64_t len;
    if (version == 1) {
      if (b.size() - at < 4) return bad(at, "file ends inside a key length");
      len = Load<uint32_t>(b.data() + at, false);
      at += 4;
    } else {
      if (b.size() - at < 2) return bad(at, "file ends inside a key length");
      len = Load<uint16_t>(b.data() + at, false);
      at += 2;
    }
    if (b.size() - at < len + 6) return bad(at, absl::StrCat("file ends inside an utterance (key of ", len, " bytes)"));
    MlfUtterance u;
    u.key = std::string(b.substr(at, len));
    at += len;
    u.frames = Load<uint32_t>(b.data() + at, false);
    const uint16_t runs = Load<uint16_t>(b.data() + at + 4, false);
    at += 6;
    if (b.size() - at < 4ull * runs) return bad(at, absl::StrCat("file ends inside the ", runs, " runs of '", u.key, "'"));
    uint64_t total = 0;
    for (uint16_t r = 0; r < runs; ++r) {
      const uint16_t state = Load<uint16_t>(b.data() + at, false), count = Load<uint16_t>(b.data() + at + 2, false);
      at += 4;
      if (count > 0) u.runs.emplace_back(state, count);
      total += count;
    }
    if (total != u.frames) {
      return bad(start, absl::StrCat("utterance '", u.key, "' says ", u.frames, " frames but its runs cover ", total));
    }
    out.utterances.push_back(std::move(u));
  }
  return out;
}

}  // namespace

absl::StatusOr<MlfFile> ParseMlf(std::string_view bytes, const std::string& path, const std::vector<std::string>& states,
                                 uint64_t frame_shift, Diagnostics* diagnostics) {
  if (bytes.substr(0, 3) == "MLF") return ParseBinaryMlf(bytes, path);
  std::unordered_map<std::string_view, uint32_t> state_index;
  for (size_t i = 0; i < states.size(); ++i) state_index.emplace(states[i], static_cast<uint32_t>(i));
  MlfFile out;
  LineReader lines(bytes);
  bool header = false;
  auto next_line = [&](std::string_view* line) {
    if (!lines.Next(line)) return false;
    *line = TrimCSpace(*line);
    return true;
  };
  auto bad = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ":", lines.line_no(), ": ", why)); };
  std::string_view line;
  while (next_line(&line)) {
    if (line.empty()) continue;
    if (line == "#!MLF!#") {
      header = true;
      continue;
    }
    if (!header) return bad("expected '#!MLF!#' on the first line of an MLF");
    if (line.front() != '"') return bad(absl::StrCat("expected a quoted utterance name, found '", AV(line.substr(0, 40)), "'"));
    MlfUtterance u;
    u.key = MlfKey(line);
    bool closed = false, valid = true;
    std::string why;
    uint64_t end_frame = 0;
    while (next_line(&line)) {
      if (line == ".") {
        closed = true;
        break;
      }
      if (line.empty()) continue;
      std::vector<std::string_view> tok;
      for (size_t i = 0; i < line.size();) {
        while (i < line.size() && IsCSpace(line[i])) ++i;
        size_t j = i;
        while (j < line.size() && !IsCSpace(line[j])) ++j;
        if (j > i) tok.push_back(line.substr(i, j - i));
        i = j;
      }
      int64_t begin, end;
      if (tok.size() < 3 || !ParseInt(tok[0], &begin) || !ParseInt(tok[1], &end) || begin < 0 || end < begin) {
        return bad("expected 'begin end label [...]' with times begin <= end (or '.' to end the utterance)");
      }
      int64_t cls = -1;
      if (!states.empty()) {
        auto it = state_index.find(tok[2]);
        if (it == state_index.end()) return bad(absl::StrCat("label '", AV(tok[2]), "' is not in the label mapping file"));
        cls = it->second;
      } else if (!(tok.size() >= 4 && ParseInt(tok[3], &cls)) && !ParseInt(tok[2], &cls)) {
        return bad(absl::StrCat("label '", AV(tok[2]), "' is not a class number (give a labelMappingFile)"));
      }
      if (cls < 0 || cls > UINT32_MAX) return bad(absl::StrCat("class ", cls, " out of range"));
      // CNTK: times in 100 ns units when a range spans at least a frame, else frame numbers.
      uint64_t b = static_cast<uint64_t>(begin), e = static_cast<uint64_t>(end);
      if (end - begin >= static_cast<int64_t>(frame_shift) - 1) {
        b = static_cast<uint64_t>(static_cast<double>(begin) / static_cast<double>(frame_shift) + 0.5);
        e = static_cast<uint64_t>(static_cast<double>(end) / static_cast<double>(frame_shift) + 0.5);
      }
      if (valid && b != end_frame) {
        valid = false;
        why = absl::StrCat("line ", lines.line_no(), " starts at frame ", b, ", the previous range ended at ", end_frame);
      }
      if (valid && e > b) u.runs.emplace_back(static_cast<uint32_t>(cls), static_cast<uint32_t>(e - b));
      end_frame = std::max(end_frame, e);
    }
    if (!closed) return bad(absl::StrCat("utterance '", u.key, "' has no closing '.'"));
    if (!valid) {
      ++out.dropped;
      diagnostics->Report(Severity::kWarning, "mlf gap",
                          absl::StrCat(path, ": utterance '", u.key, "': ", why, " (ranges must be consecutive from 0); skipped"));
      continue;
    }
    u.frames = static_cast<uint32_t>(end_frame);
    out.utterances.push_back(std::move(u));
  }
  if (!header) return absl::DataLossError(absl::StrCat(path, ": empty MLF (expected '#!MLF!#')"));
  return out;
}

namespace {

class MlfSource final : public Deserializer {
 public:
  absl::Status Open(const DeserializerConfig& d, Diagnostics* diag, ErrorBudget* budget) {
    streams_ = d.streams;
    if (streams_.size() != 1) return absl::InvalidArgumentError("an HTKMLF deserializer has exactly one input (add another deserializer for more)");
    const StreamConfig& sc = streams_[0];
    path_ = sc.mlf_file;
    std::vector<std::string> states;
    if (!sc.label_mapping_file.empty()) {
      ASSIGN_OR_RETURN(std::string text, ReadFileToString(sc.label_mapping_file));
      std::unordered_map<std::string, size_t> seen;
      LineReader lines(text);
      std::string_view raw;
      while (lines.Next(&raw)) {
        const std::string_view line = TrimCSpace(raw);
        const uint64_t line_no = lines.line_no();
        if (line.empty()) continue;
        if (!seen.emplace(std::string(line), line_no).second) {
          return absl::InvalidArgumentError(absl::StrCat(sc.label_mapping_file, ":", line_no, ": label '", AV(line),
                                                         "' is listed twice (first at line ", seen[std::string(line)], ")"));
        }
        states.emplace_back(line);
      }
      if (states.size() > sc.dim) {
        return absl::InvalidArgumentError(absl::StrCat(sc.label_mapping_file, " lists ", states.size(), " labels but input '", sc.name,
                                                       "' has labelDim ", sc.dim));
      }
    }
    auto map = MappedFile::Open(path_);
    if (!map.ok()) return map.status();
    ASSIGN_OR_RETURN(MlfFile mlf, ParseMlf((*map)->bytes(), path_, states, sc.frame_shift, diag));
    skipped_ = mlf.dropped;
    for (MlfUtterance& u : mlf.utterances) {
      bool ok = true;
      for (const auto& [cls, n] : u.runs) {
        if (cls >= sc.dim) {
          const std::string message = absl::StrCat(path_, ": utterance '", u.key, "': class ", cls, " is outside [0, ", sc.dim,
                                                    ") (input '", sc.name, "' labelDim)");
          if (!budget->Spend()) return absl::DataLossError(absl::StrCat(message, " (more than maxErrors=", budget->max_errors(), " input errors)"));
          diag->Report(Severity::kWarning, "mlf class", absl::StrCat(message, "; skipped"));
          ++skipped_;
          ok = false;
          break;
        }
      }
      if (ok) utterances_.push_back(std::move(u));
    }
    map_ = std::move(*map);
    return absl::OkStatus();
  }

  const std::vector<StreamConfig>& streams() const override { return streams_; }
  size_t size() const override { return utterances_.size(); }
  const std::string& key(size_t i) const override { return utterances_[i].key; }
  uint32_t samples(size_t i, size_t) const override { return utterances_[i].frames; }
  uint64_t bytes(size_t i) const override { return 4ull * utterances_[i].runs.size(); }
  std::vector<std::string_view> inputs() const override { return {map_->bytes()}; }
  std::vector<std::string> input_paths() const override { return {map_->path()}; }
  std::string description() const override { return path_; }
  uint64_t skipped() const override { return skipped_; }
  bool aligned_frames() const override { return true; }

  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override {
    ParsedStream& ps = *out[0];
    const MlfUtterance& u = utterances_[i];
    const bool ids = streams_[0].format == StreamFormat::kIds;
    uint64_t nnz = ps.nnz_begin.back();
    for (const auto& [cls, n] : u.runs) {
      ps.indices.insert(ps.indices.end(), n, static_cast<int32_t>(cls));
      if (ids) continue;
      for (uint32_t k = 0; k < n; ++k) ps.nnz_begin.push_back(++nnz);
      if (precision == Precision::kFloat) ps.values_f32.insert(ps.values_f32.end(), n, 1.0f);
      else ps.values_f64.insert(ps.values_f64.end(), n, 1.0);
    }
    ps.sequence_begin.push_back(ps.sequence_begin.back() + u.frames);
    return absl::OkStatus();
  }

 private:
  std::vector<StreamConfig> streams_;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<MlfUtterance> utterances_;
  uint64_t skipped_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenMlfDeserializer(const DeserializerContext& context) {
  auto s = std::make_unique<MlfSource>();
  RETURN_IF_ERROR(s->Open(context.config, context.diagnostics, context.budget));
  return std::unique_ptr<Deserializer>(std::move(s));
}

}  // namespace conveyor
