#include "tests/common/formats/keyed_labels/keyed_labels.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "common/text_lines.h"

namespace conveyor::example {
namespace {

class KeyedLabels final : public Deserializer {
 public:
  absl::Status Open(const DeserializerContext& context) {
    streams_ = context.config.streams;
    if (streams_.size() != 1) return absl::InvalidArgumentError("a KeyedLabels deserializer has exactly one input");
    path_ = context.config.file;
    ASSIGN_OR_RETURN(file_, MappedFile::Open(path_));
    LineReader lines(file_->bytes());
    std::string_view line;
    while (lines.Next(&line)) {
      line = TrimCSpace(line);
      if (line.empty()) continue;
      Entry e;
      e.first = labels_.size();
      const std::string_view why = Parse(line, &e);
      if (why.empty()) {
        entries_.push_back(std::move(e));
        continue;
      }
      labels_.resize(e.first);  // drop what the bad line added
      const std::string message = absl::StrCat(path_, ":", lines.line_no(), ": ", AV(why));
      if (!context.budget->Spend()) {
        return absl::DataLossError(absl::StrCat(message, " (more than maxErrors=", context.budget->max_errors(), " input errors)"));
      }
      context.diagnostics->Report(Severity::kWarning, "keyed labels", absl::StrCat(message, "; skipped"));
      ++skipped_;
    }
    return absl::OkStatus();
  }

  const std::vector<StreamConfig>& streams() const override { return streams_; }
  size_t size() const override { return entries_.size(); }
  const std::string& key(size_t i) const override { return entries_[i].key; }
  uint32_t samples(size_t i, size_t) const override { return entries_[i].count; }
  uint64_t bytes(size_t i) const override { return entries_[i].bytes; }
  std::vector<std::string_view> inputs() const override { return {file_->bytes()}; }
  std::vector<std::string> input_paths() const override { return {file_->path()}; }
  std::string description() const override { return path_; }
  uint64_t skipped() const override { return skipped_; }

  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override {
    ParsedStream& ps = *out[0];
    const Entry& e = entries_[i];
    for (uint32_t t = 0; t < e.count; ++t) {
      ps.indices.push_back(labels_[e.first + t]);
      if (ps.format == StreamFormat::kIds) continue;
      ps.nnz_begin.push_back(ps.nnz_begin.back() + 1);  // one-hot
      if (precision == Precision::kFloat) ps.values_f32.push_back(1.0f);
      else ps.values_f64.push_back(1.0);
    }
    ps.sequence_begin.push_back(ps.sequence_begin.back() + e.count);
    return absl::OkStatus();
  }

 private:
  struct Entry {
    std::string key;
    uint64_t first = 0;  // its labels: labels_[first, first + count)
    uint32_t count = 0;
    uint64_t bytes = 0;
  };

  // Parses `key class...` into `e` and labels_; returns why it is bad, or "".
  std::string_view Parse(std::string_view line, Entry* e) {
    e->bytes = line.size();
    size_t at = 0;
    while (at < line.size()) {
      const size_t end = std::min(line.size(), line.find_first_of(" \t", at));
      const std::string_view token = line.substr(at, end - at);
      at = end + 1;
      if (token.empty()) continue;
      if (e->key.empty()) {
        e->key = std::string(token);
        continue;
      }
      int32_t cls = -1;
      const auto r = std::from_chars(token.data(), token.data() + token.size(), cls);
      if (r.ec != std::errc() || r.ptr != token.data() + token.size()) return "expected a class number";
      if (cls < 0 || static_cast<uint64_t>(cls) >= streams_[0].dim) return "class outside [0, dim)";
      labels_.push_back(cls);
      ++e->count;
    }
    return e->key.empty() ? "expected a key" : "";
  }

  std::vector<StreamConfig> streams_;
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  std::vector<Entry> entries_;
  std::vector<int32_t> labels_;
  uint64_t skipped_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenKeyedLabels(const DeserializerContext& context) {
  auto d = std::make_unique<KeyedLabels>();
  RETURN_IF_ERROR(d->Open(context));
  return std::unique_ptr<Deserializer>(std::move(d));
}

}  // namespace conveyor::example
