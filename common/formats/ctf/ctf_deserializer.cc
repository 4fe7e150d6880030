#include "common/formats/ctf/ctf_deserializer.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/chunked_file.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/formats/ctf/ctf_parser.h"
#include "common/index/index_cache.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

class CtfDeserializer final : public ChunkedFileDeserializer {
 public:
  explicit CtfDeserializer(const DeserializerContext& context) : ChunkedFileDeserializer(context) {}

  absl::Status Open(const DeserializerContext& context);

  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(uint64_t chunk_id) const override {
    ASSIGN_OR_RETURN(HugeBytes text, ReadChunk(chunk_id));  // parsed, then given back for the next chunk
    return parser_->ParseChunk({text.data(), text.size()}, index_.chunks[chunk_id].begin_offset, index_, chunk_id);
  }

 private:
  absl::Status LoadOrBuildIndex(const DeserializerContext& context);
  absl::Status SpendIndexErrors();
  void WarnAboutAbsentInputs();

  std::unique_ptr<CtfParser> parser_;
};

absl::Status CtfDeserializer::Open(const DeserializerContext& context) {
  const DeserializerConfig& d = context.config;
  streams_ = d.streams;
  RETURN_IF_ERROR(MapFile(context));
  RETURN_IF_ERROR(LoadOrBuildIndex(context));
  RETURN_IF_ERROR(SpendIndexErrors());
  WarnAboutAbsentInputs();
  CtfParserOptions po;
  po.path = d.file;
  po.streams = streams_;
  po.precision = context.dataset.precision;
  parser_ = std::make_unique<CtfParser>(std::move(po), diagnostics_, budget_);
  return FinishOpen(context);
}

absl::Status CtfDeserializer::LoadOrBuildIndex(const DeserializerContext& context) {
  const DeserializerConfig& d = context.config;
  CtfIndexOptions io;
  io.skip_sequence_ids = d.skip_sequence_ids;
  for (const auto& s : streams_)
    if (s.defines_mb_size) io.main_alias = s.alias;
  io.chunk_size = d.chunk_size_in_bytes;
  io.threads = context.options.index_threads;
  const uint64_t total = file_->bytes().size();
  if (context.progress) io.progress = [&context, total](uint64_t done) { context.progress(done, total); };

  const uint64_t hash = CtfIndexConfigHash(io);
  bool loaded = false;
  FileStamp stamp = file_->stamp();
  if (context.dataset.cache_index) {
    stamp.sample_hash = file_->SampleHash();
    cache_path_ = IndexCachePath(d.file, hash);
    auto cached = ReadIndexCache(cache_path_, stamp, hash, io.threads);
    if (cached.ok() && cached->has_value()) {
      index_ = std::move(**cached);
      index_.BuildChunks(d.chunk_size_in_bytes);
      index_source_ = IndexSource::kCache;
      loaded = true;
    } else if (!cached.ok()) {
      index_source_ = absl::IsFailedPrecondition(cached.status()) ? IndexSource::kRebuiltStaleCache
                                                                  : IndexSource::kRebuiltBadCache;
      diagnostics_->Report(Severity::kInfo, "index cache",
                           absl::StrCat(cached.status().message(), "; rebuilding the index"));
    }
  }
  if (!loaded) {
    const MappedFile* file = file_.get();
    io.read = [file](uint64_t offset, uint64_t length, char* out) { return file->Read(offset, length, out); };
    ASSIGN_OR_RETURN(index_, BuildCtfIndex(file_->bytes(), d.file, io));
    DropPages(0, total);  // what the scan touched of the mapping; chunks are read (ReadChunk)
    index_.ComputeContentHash();
    if (context.dataset.cache_index) {
      absl::Status w = WriteIndexCache(cache_path_, index_, stamp, hash);
      if (!w.ok()) diagnostics_->Report(Severity::kWarning, "index cache", absl::StrCat(w.message(), " (continuing without a cache)"));
    }
  }
  return absl::OkStatus();
}

// An input whose name in the file (its alias, else its name) is misspelt in the configuration
// matches nothing: every sequence would lack it, silently (a line without an input is
// legal). So the inputs the file's first 1 MiB names are compared with those configured, and
// each configured one not among them is a warning listing what the file does name there.
void CtfDeserializer::WarnAboutAbsentInputs() {
  constexpr uint64_t kLook = uint64_t{1} << 20;
  const uint64_t size = file_->bytes().size();
  const uint64_t n = std::min(size, kLook);
  if (n == 0) return;
  std::string head(n, '\0');
  if (!file_->Read(0, n, head.data()).ok()) return;  // (a read error is the parse's to report)
  std::set<std::string> seen;
  for (size_t at = head.find('|'); at != std::string::npos && seen.size() < 256; at = head.find('|', at + 1)) {
    size_t end = at + 1;
    while (end < head.size() && head[end] != ' ' && head[end] != '\t' && head[end] != '|' && head[end] != '\n' &&
           head[end] != '\r') {
      ++end;
    }
    if (end > at + 1 && head[at + 1] != '#' && end < head.size()) seen.insert(head.substr(at + 1, end - at - 1));
  }
  if (seen.empty()) return;
  for (const StreamConfig& s : streams_) {
    if (seen.count(s.alias) > 0) continue;
    const std::string which = s.alias == s.name ? absl::StrCat("input '", s.name, "'")
                                                : absl::StrCat("input '", s.name, "' (alias '", s.alias, "')");
    diagnostics_->Report(Severity::kWarning, "config",
                         absl::StrCat(which, n == size ? " never occurs in " : " does not occur in the first 1 MiB of ",
                                      path_, " (the inputs there: ", absl::StrJoin(seen, ", "),
                                      "); its sequences will have no samples of it unless its name or alias is fixed"));
  }
}

// Blank rows and repeated ids found by the index pass are input errors like any other.
absl::Status CtfDeserializer::SpendIndexErrors() {
  if (index_.errors.count == 0) return absl::OkStatus();
  auto describe = [&](const IndexError& e) {
    if (e.kind == IndexError::kRepeatedId) {
      return absl::StrCat(path_, ":", e.line + 1, ":1: sequence id ", e.key, " was already used at line ",
                          e.first_line + 1, ": an id may repeat only on consecutive lines");
    }
    return absl::StrCat(path_, ":", e.line + 1, ":1: empty row: expected a sequence id or '|' and an input");
  };
  const std::string first = index_.errors.first.empty() ? absl::StrCat(path_, ": input errors")
                                                        : describe(index_.errors.first[0]);
  if (!budget_->Spend(index_.errors.count)) {
    return absl::DataLossError(absl::StrCat(first, " (", index_.errors.count, " such errors; more than maxErrors=",
                                            budget_->max_errors(), " input errors)"));
  }
  for (const IndexError& e : index_.errors.first) {
    diagnostics_->Report(Severity::kWarning, "index error", absl::StrCat(describe(e), "; skipped"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenCtfDeserializer(const DeserializerContext& context) {
  auto d = std::make_unique<CtfDeserializer>(context);
  RETURN_IF_ERROR(d->Open(context));
  return std::unique_ptr<Deserializer>(std::move(d));
}

}  // namespace conveyor
