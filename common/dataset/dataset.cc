#include "common/dataset/dataset.h"

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/index/index_cache.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetConfig& config,
                                                       const DatasetOpenOptions& options) {
  std::unique_ptr<Dataset> ds(new Dataset(config));
  RETURN_IF_ERROR(ds->Init(options));
  return ds;
}

absl::Status Dataset::Init(const DatasetOpenOptions& options) {
  if (config_.deserializers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", config_.name, "' has no deserializer"));
  }
  if (config_.deserializers.size() > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "dataset '", config_.name, "' combines ", config_.deserializers.size(),
        " deserializers; composite datasets are not supported by this build yet"));
  }
  const DeserializerConfig& d = config_.deserializers[0];
  if (d.type != "CNTKTextFormat" && d.type != "CNTKBinary") {
    return absl::UnimplementedError(absl::StrCat("deserializer type '", d.type, "' is not supported by this build"));
  }
  streams_ = d.streams;
  diagnostics_ = std::make_unique<Diagnostics>(config_.EffectiveTraceLevel(), options.diagnostics_sink);
  budget_ = std::make_unique<ErrorBudget>(options.max_errors_override.value_or(config_.EffectiveMaxErrors()));
  ASSIGN_OR_RETURN(file_, MappedFile::Open(d.file));
  if (d.type == "CNTKBinary") return InitCbf(options);

  CtfIndexOptions io;
  io.skip_sequence_ids = d.skip_sequence_ids;
  for (const auto& s : streams_)
    if (s.defines_mb_size) io.main_alias = s.alias;
  io.chunk_size = d.chunk_size_in_bytes;
  io.threads = options.index_threads;
  const uint64_t total = file_->bytes().size();
  if (options.progress) io.progress = [&options, total](uint64_t done) { options.progress(done, total); };

  const uint64_t hash = CtfIndexConfigHash(io);
  bool loaded = false;
  if (config_.cache_index) {
    cache_path_ = IndexCachePath(d.file, hash);
    auto cached = ReadIndexCache(cache_path_, file_->stamp(), hash);
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
    ASSIGN_OR_RETURN(index_, BuildCtfIndex(file_->bytes(), d.file, io));
    index_.ComputeContentHash();
    if (config_.cache_index) {
      absl::Status w = WriteIndexCache(cache_path_, index_, file_->stamp(), hash);
      if (!w.ok()) diagnostics_->Report(Severity::kWarning, "index cache", absl::StrCat(w.message(), " (continuing without a cache)"));
    }
  }
  // Blank rows and repeated ids found by the index pass are input errors like any other.
  if (index_.errors.count > 0) {
    auto describe = [&](const IndexError& e) {
      if (e.kind == IndexError::kRepeatedId) {
        return absl::StrCat(d.file, ":", e.line + 1, ":1: sequence id ", e.key, " was already used at line ",
                            e.first_line + 1, ": an id may repeat only on consecutive lines");
      }
      return absl::StrCat(d.file, ":", e.line + 1, ":1: empty row: expected a sequence id or '|' and an input");
    };
    const std::string first = index_.errors.first.empty() ? absl::StrCat(d.file, ": input errors")
                                                          : describe(index_.errors.first[0]);
    if (!budget_->Spend(index_.errors.count)) {
      return absl::DataLossError(absl::StrCat(first, " (", index_.errors.count, " such errors; more than maxErrors=",
                                              budget_->max_errors(), " input errors)"));
    }
    for (const IndexError& e : index_.errors.first) {
      diagnostics_->Report(Severity::kWarning, "index error", absl::StrCat(describe(e), "; skipped"));
    }
  }
  CtfParserOptions po;
  po.path = d.file;
  po.streams = streams_;
  po.precision = config_.precision;
  parser_ = std::make_unique<CtfParser>(std::move(po), diagnostics_.get(), budget_.get());
  return absl::OkStatus();
}

absl::Status Dataset::InitCbf(const DatasetOpenOptions& options) {
  const DeserializerConfig& d = config_.deserializers[0];
  const std::string_view bytes = file_->bytes();
  if (!IsCbf(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(d.file, ": not a CNTK binary file (expected the magic number "
                                                   "\"cntk_bin\" at byte 0; convert text with `conveyor convert`)"));
  }
  ASSIGN_OR_RETURN(CbfFile file, ReadCbfFile(bytes, d.file));
  cbf_ = std::make_unique<CbfFile>(std::move(file));
  for (const CbfStreamInfo& s : cbf_->streams) {
    if (s.precision != config_.precision) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.file, ": stream '", s.name, "' holds ", s.precision == Precision::kFloat ? "float" : "double",
          " values but the dataset's precision is ", config_.precision == Precision::kFloat ? "float" : "double",
          " (set `precision: ", s.precision == Precision::kFloat ? "float" : "double", "`)"));
    }
  }
  auto file_names = [&] {
    std::string out;
    for (const CbfStreamInfo& s : cbf_->streams) absl::StrAppend(&out, out.empty() ? "" : ", ", s.name);
    return out;
  };
  // Without `input`, every stream of the file under its own name; with it, the named streams
  // (`alias`: the file's name for it), checked against what the file declares.
  if (streams_.empty()) {
    for (const CbfStreamInfo& s : cbf_->streams) {
      StreamConfig sc;
      sc.name = sc.alias = s.name;
      sc.format_given = false;
      streams_.push_back(sc);
    }
  }
  for (StreamConfig& sc : streams_) {
    int found = -1;
    for (size_t i = 0; i < cbf_->streams.size(); ++i)
      if (cbf_->streams[i].name == sc.alias) found = static_cast<int>(i);
    if (found < 0) {
      return absl::InvalidArgumentError(absl::StrCat(d.file, ": input '", sc.name, "' names stream '", sc.alias,
                                                     "', which the file does not have (it has: ", file_names(), ")"));
    }
    const CbfStreamInfo& s = cbf_->streams[found];
    if ((sc.format_given && sc.format != s.format) || (sc.dim != 0 && sc.dim != s.dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.file, ": input '", sc.name, "' is configured as ", StreamFormatName(sc.format), " dim ", sc.dim,
          " but the file's stream '", s.name, "' is ", StreamFormatName(s.format), " dim ", s.dim));
    }
    sc.format = s.format;
    sc.dim = s.dim;
    cbf_source_.push_back(found);
  }
  if (options.progress) options.progress(0, file_->bytes().size());
  ASSIGN_OR_RETURN(index_, BuildCbfIndex(*cbf_, bytes, d.file));
  if (options.progress) options.progress(file_->bytes().size(), file_->bytes().size());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> Dataset::ParseChunk(uint64_t chunk_id) const {
  parses_.fetch_add(1);
  if (cbf_) return ParseCbfChunk(file_->bytes(), *cbf_, index_, chunk_id, cbf_source_, config_.precision, path());
  return parser_->ParseChunk(file_->bytes(), index_, chunk_id);
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> Dataset::SharedChunk(uint64_t chunk_id) const {
  std::unique_lock<std::mutex> lock(cache_mu_);
  while (true) {
    CacheEntry& e = cache_[chunk_id];
    if (auto live = e.chunk.lock()) return live;
    if (!e.parsing) break;
    cache_cv_.wait(lock);  // another reader is parsing it
  }
  cache_[chunk_id].parsing = true;
  lock.unlock();
  auto parsed = ParseChunk(chunk_id);
  DoneWith(chunk_id);
  lock.lock();
  CacheEntry& e = cache_[chunk_id];
  e.parsing = false;
  cache_cv_.notify_all();
  if (!parsed.ok()) return parsed.status();
  const uint64_t bytes = (*parsed)->MemoryBytes();
  resident_->chunks += 1;
  resident_->bytes += bytes;
  std::shared_ptr<const ParsedChunk> chunk((*parsed).release(), [resident = resident_, bytes](const ParsedChunk* c) {
    resident->chunks -= 1;
    resident->bytes -= bytes;
    delete c;
  });
  e.chunk = chunk;
  return chunk;
}

uint64_t Dataset::ChunkBytes(uint64_t chunk_id) const {
  const ChunkEntry& c = index_.chunks[chunk_id];
  return c.end_offset - c.begin_offset;
}

void Dataset::WillNeed(uint64_t chunk_id) const {
  const ChunkEntry& c = index_.chunks[chunk_id];
  file_->WillNeed(c.begin_offset, c.end_offset - c.begin_offset);
}

void Dataset::DoneWith(uint64_t chunk_id) const {
  const ChunkEntry& c = index_.chunks[chunk_id];
  file_->DontNeed(c.begin_offset, c.end_offset - c.begin_offset);
}

}  // namespace conveyor
