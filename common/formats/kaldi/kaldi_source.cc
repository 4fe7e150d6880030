#include "common/formats/kaldi/kaldi_source.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

using kaldi::KaldiTable;
using kaldi::ObjectKind;
using kaldi::ObjectType;
using kaldi::TableEntry;

class KaldiSource final : public Deserializer {
 public:
  KaldiSource(std::unique_ptr<KaldiTable> table, const DeserializerConfig& d)
      : table_(std::move(table)), kind_(d.kaldi_kind), streams_(d.streams), rspecifier_(d.rspecifier) {}

  absl::Status Select(Diagnostics* diagnostics, ErrorBudget* budget) {
    StreamConfig& sc = streams_[0];
    const auto& entries = table_->entries();
    auto reject = [&](size_t i, const std::string& why) -> absl::Status {
      const std::string message = absl::StrCat(rspecifier_, ": entry '", entries[i].key, "': ", why);
      if (!table_->spec().permissive && !budget->Spend()) {
        return absl::InvalidArgumentError(absl::StrCat(message, " (more than maxErrors=", budget->max_errors(), " input errors)"));
      }
      diagnostics->Report(Severity::kWarning, "kaldi entry", absl::StrCat(message, "; skipped"));
      ++skipped_;
      return absl::OkStatus();
    };
    std::vector<int32_t> ids;
    for (size_t i = 0; i < entries.size(); ++i) {
      const TableEntry& e = entries[i];
      if (kind_ == KaldiKind::kInt32Vector) {
        if (sc.format == StreamFormat::kSparse) {
          table_->DecodeInts(i, &ids);
          bool bad = false;
          for (size_t t = 0; t < ids.size() && !bad; ++t) {
            if (ids[t] < 0 || static_cast<uint64_t>(ids[t]) >= sc.dim) {
              RETURN_IF_ERROR(reject(i, absl::StrCat("label ", ids[t], " at position ", t, " is outside [0, ", sc.dim,
                                                     ") (input '", sc.name, "' dim)")));
              bad = true;
            }
          }
          if (bad) continue;
        }
        kept_.push_back(static_cast<uint32_t>(i));
        continue;
      }
      const uint64_t cols = e.window.rows == 0 ? 0 : static_cast<uint64_t>(e.window.cols);
      if (cols > 0) {
        if (!sc.dim_given && sc.dim == 0) sc.dim = cols;
        if (cols != sc.dim) {
          RETURN_IF_ERROR(reject(i, absl::StrCat("has ", cols, kind_ == KaldiKind::kMatrix ? " columns" : " values",
                                                 " but input '", sc.name, "' has dim ", sc.dim,
                                                 sc.dim_given ? "" : " (from the table's first entry)")));
          continue;
        }
      }
      kept_.push_back(static_cast<uint32_t>(i));
    }
    if (sc.dim == 0 && sc.format != StreamFormat::kIds) {
      if (kept_.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(rspecifier_, ": no entry to read (and no dim configured for input '",
                                                       sc.name, "')"));
      }
      sc.dim = 1;  // every entry is empty: nothing will be delivered
    }
    return absl::OkStatus();
  }

  const std::vector<StreamConfig>& streams() const override { return streams_; }
  size_t size() const override { return kept_.size(); }
  const std::string& key(size_t i) const override { return entry(i).key; }
  uint32_t samples(size_t i, size_t) const override {
    const TableEntry& e = entry(i);
    if (e.window.rows == 0 || e.window.cols == 0) return 0;
    switch (kind_) {
      case KaldiKind::kMatrix: return static_cast<uint32_t>(e.window.rows);
      case KaldiKind::kVector: return 1;
      case KaldiKind::kInt32Vector: return static_cast<uint32_t>(e.window.cols);
    }
    return 0;
  }
  uint64_t bytes(size_t i) const override { return entry(i).info.size; }
  void WillNeed(size_t i) const override { table_->WillNeed(kept_[i]); }
  absl::Status CheckUnchanged(absl::Span<const size_t> entries) const override {
    // A chunk's entries lie in one archive or a few, in runs; or in a file each (an scp of one
    // archive an utterance): then a few of them each parse (MappedFile::CheckSomeUnchanged).
    std::vector<const MappedFile*> files;
    uint32_t last = UINT32_MAX;
    for (size_t i : entries) {
      const uint32_t src = entry(i).source;
      if (src == last) continue;
      last = src;
      files.push_back(table_->file(src));
    }
    return MappedFile::CheckSomeUnchanged(&files, &rotation_);
  }
  std::vector<std::string_view> inputs() const override {
    std::vector<std::string_view> out;
    for (uint32_t s = 0; s < table_->num_sources(); ++s) out.push_back(table_->bytes(s));
    return out;
  }
  std::vector<std::string> input_paths() const override {
    std::vector<std::string> out;
    for (uint32_t s = 0; s < table_->num_sources(); ++s) out.push_back(table_->source_path(s));
    return out;
  }
  std::string description() const override { return rspecifier_; }
  uint64_t skipped() const override { return table_->skipped() + skipped_; }

  const std::byte* InPlace(size_t i, Precision precision) const override {
    if (kind_ == KaldiKind::kInt32Vector) return nullptr;
    const TableEntry& e = entry(i);
    return reinterpret_cast<const std::byte*>(
        ContiguousValues(table_->bytes(e.source), e.offset, e.info, e.window, precision == Precision::kDouble));
  }

  bool Compressed(size_t i, CompressedDense* out) const override {
    if (kind_ != KaldiKind::kMatrix) return false;
    const TableEntry& e = entry(i);
    const ObjectType t = e.info.type;
    if (t != ObjectType::kCompressed1 && t != ObjectType::kCompressed2 && t != ObjectType::kCompressed3) return false;
    if (e.window.cols != static_cast<int64_t>(streams_[0].dim)) return false;
    out->object = table_->bytes(e.source).data() + e.offset;
    out->info = kaldi::ToCompressedHeader(e.info);
    out->row0 = e.window.row0;
    out->col0 = e.window.col0;
    return true;
  }

  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override {
    ParsedStream& ps = *out[0];
    const uint32_t n = samples(i, 0);
    if (kind_ == KaldiKind::kInt32Vector) {
      thread_local std::vector<int32_t> ids;
      if (n > 0) table_->DecodeInts(kept_[i], &ids);
      else ids.clear();
      if (streams_[0].format == StreamFormat::kIds) {
        ps.indices.insert(ps.indices.end(), ids.begin(), ids.end());
      } else {
        uint64_t nnz = ps.nnz_begin.back();
        for (int32_t id : ids) {
          ps.indices.push_back(id);
          ps.nnz_begin.push_back(++nnz);
        }
        if (precision == Precision::kFloat) ps.values_f32.insert(ps.values_f32.end(), ids.size(), 1.0f);
        else ps.values_f64.insert(ps.values_f64.end(), ids.size(), 1.0);
      }
    } else if (n > 0) {
      const uint64_t count = uint64_t{n} * streams_[0].dim;
      if (precision == Precision::kFloat) {
        const size_t at = ps.values_f32.size();
        ps.values_f32.resize(at + count);
        table_->Decode<float>(kept_[i], ps.values_f32.data() + at);
      } else {
        const size_t at = ps.values_f64.size();
        ps.values_f64.resize(at + count);
        table_->Decode<double>(kept_[i], ps.values_f64.data() + at);
      }
    }
    ps.sequence_begin.push_back(ps.sequence_begin.back() + n);
    return absl::OkStatus();
  }

 private:
  const TableEntry& entry(size_t i) const { return table_->entries()[kept_[i]]; }

  std::unique_ptr<KaldiTable> table_;
  mutable std::atomic<uint64_t> rotation_{0};  // CheckUnchanged()'s place among many files
  const KaldiKind kind_;
  std::vector<StreamConfig> streams_;
  const std::string rspecifier_;
  std::vector<uint32_t> kept_;
  uint64_t skipped_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenKaldiDeserializer(const DeserializerContext& context) {
  const DeserializerConfig& d = context.config;
  const bool allow_pipes = d.allow_pipes.value_or(context.dataset.allow_pipes);
  Diagnostics* const diagnostics = context.diagnostics;
  ErrorBudget* const budget = context.budget;
  kaldi::TableOptions o;
  o.kind = d.kaldi_kind == KaldiKind::kMatrix ? ObjectKind::kMatrix
           : d.kaldi_kind == KaldiKind::kVector ? ObjectKind::kVector
                                                : ObjectKind::kInt32Vector;
  o.allow_pipes = allow_pipes;
  o.base_dir = d.base_dir;
  o.tolerate = [budget](const std::string&) { return budget->Spend(); };
  o.warn = [diagnostics](const std::string& w) { diagnostics->Report(Severity::kWarning, "kaldi", w); };
  o.progress = context.progress;
  ASSIGN_OR_RETURN(std::unique_ptr<KaldiTable> table, KaldiTable::Open(d.rspecifier, o));
  auto source = std::make_unique<KaldiSource>(std::move(table), d);
  RETURN_IF_ERROR(source->Select(diagnostics, budget));
  return std::unique_ptr<Deserializer>(std::move(source));
}

}  // namespace conveyor
