#include "common/dataset/dataset.h"

#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/dataset/file_source.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/formats/htk/htk_source.h"
#include "common/formats/kaldi/kaldi_source.h"
#include "common/index/index_cache.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

bool IsKeyed(const std::string& type) { return type == "KaldiTable" || type == "HTKFeature" || type == "HTKMLF"; }

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetConfig& config,
                                                       const DatasetOpenOptions& options) {
  std::unique_ptr<Dataset> ds(new Dataset(config));
  RETURN_IF_ERROR(ds->Init(options));
  return ds;
}

Dataset::~Dataset() {
  std::lock_guard<std::mutex> lock(resident_->mu);
  resident_->file = nullptr;
}

absl::Status Dataset::Init(const DatasetOpenOptions& options) {
  if (config_.deserializers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", config_.name, "' has no deserializer"));
  }
  diagnostics_ = std::make_unique<Diagnostics>(config_.EffectiveTraceLevel(), options.diagnostics_sink);
  budget_ = std::make_unique<ErrorBudget>(options.max_errors_override.value_or(config_.EffectiveMaxErrors()));
  // Not for datasets read as frames by default: a random frame is a row of 1-byte CM values,
  // each decoded alone (no per-column table to amortize), which costs the host more than
  // decoding whole utterances at parse time (bench/RESULTS.md, staging_bench).
  compressed_in_place_ = options.compressed_in_place && !config_.frame_mode;
  bool keyed = false;
  for (const DeserializerConfig& d : config_.deserializers) keyed = keyed || IsKeyed(d.type);
  // Several deserializers (or a keyed one): sequences joined by key.
  if (keyed || config_.deserializers.size() > 1) return InitKeyed(options);
  const DeserializerConfig& d = config_.deserializers[0];
  if (d.type != "CNTKTextFormat" && d.type != "CNTKBinary") {
    return absl::UnimplementedError(absl::StrCat("deserializer type '", d.type, "' is not supported by this build"));
  }
  streams_ = d.streams;
  path_ = d.file;
  ASSIGN_OR_RETURN(file_, MappedFile::Open(d.file));
  {
    std::lock_guard<std::mutex> lock(resident_->mu);
    resident_->file = file_.get();
  }
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
                                                   "\"cntk_bin\" or the documented layout's version 1 at byte 0; convert text with `conveyor convert`)"));
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

absl::Status Dataset::InitKeyed(const DatasetOpenOptions& options) {
  const size_t ns = config_.deserializers.size();
  bool htk = false;
  for (size_t s = 0; s < ns; ++s) {
    const DeserializerConfig& d = config_.deserializers[s];
    std::unique_ptr<KeyedSource> src;
    if (d.type == "CNTKTextFormat" || d.type == "CNTKBinary") {
      ASSIGN_OR_RETURN(src, OpenFileSource(config_, d, options));
    } else if (!IsKeyed(d.type)) {
      return absl::UnimplementedError(absl::StrCat("deserializer type '", d.type, "' is not supported by this build"));
    } else if (d.type == "KaldiTable") {
      ASSIGN_OR_RETURN(src, OpenKaldiSource(d, d.allow_pipes.value_or(config_.allow_pipes), diagnostics_.get(), budget_.get(), options.progress));
    } else if (d.type == "HTKFeature") {
      ASSIGN_OR_RETURN(src, OpenHtkFeatureSource(d, d.base_dir, diagnostics_.get(), budget_.get()));
    } else {
      ASSIGN_OR_RETURN(src, OpenMlfSource(d, diagnostics_.get(), budget_.get()));
    }
    if (d.type == "HTKFeature" || d.type == "HTKMLF") htk = true;
    stream_base_.push_back(streams_.size());
    for (const StreamConfig& sc : src->streams()) streams_.push_back(sc);
    SourceStats st;
    st.type = d.type;
    st.description = src->description();
    st.entries = src->size();
    st.skipped = src->skipped();
    source_stats_.push_back(st);
    keyed_.push_back(std::move(src));
  }
  path_ = keyed_[0]->description();
  // Secondary sources by key (the first of repeated keys).
  std::vector<std::unordered_map<std::string_view, uint32_t>> by_key(ns);
  for (size_t s = 1; s < ns; ++s) {
    by_key[s].reserve(keyed_[s]->size());
    for (size_t j = 0; j < keyed_[s]->size(); ++j) {
      if (!by_key[s].emplace(keyed_[s]->key(j), static_cast<uint32_t>(j)).second) {
        ++source_stats_[s].duplicates;
        diagnostics_->Report(Severity::kWarning, "repeated key",
                             absl::StrCat(keyed_[s]->description(), ": key '", keyed_[s]->key(j),
                                          "' appears again; its first entry is used"));
      }
    }
  }
  int main_stream = -1;
  for (size_t k = 0; k < streams_.size(); ++k)
    if (streams_[k].defines_mb_size) main_stream = static_cast<int>(k);
  std::vector<uint32_t> row(ns);
  uint64_t offset = 0;
  for (size_t i = 0; i < keyed_[0]->size(); ++i) {
    const std::string& key = keyed_[0]->key(i);
    row[0] = static_cast<uint32_t>(i);
    bool missing = false;
    for (size_t s = 1; s < ns && !missing; ++s) {
      auto it = by_key[s].find(key);
      if (it == by_key[s].end()) {
        // MLF names given as "*/name" patterns match an scp id by its last component.
        const size_t slash = key.rfind('/');
        if (slash != std::string::npos) it = by_key[s].find(std::string_view(key).substr(slash + 1));
      }
      if (it == by_key[s].end()) {
        missing = true;
        ++source_stats_[s].missing;
        diagnostics_->Report(Severity::kWarning, "missing key",
                             absl::StrCat(keyed_[s]->description(), " has no entry '", key, "' of ",
                                          keyed_[0]->description(), "; sequence skipped"));
      } else {
        row[s] = it->second;
      }
    }
    if (missing) continue;
    uint32_t longest = 0, shortest = UINT32_MAX, main = 0;
    uint64_t bytes = 0;
    for (size_t s = 0; s < ns; ++s) {
      for (size_t k = 0; k < keyed_[s]->streams().size(); ++k) {
        const uint32_t n = keyed_[s]->samples(row[s], k);
        longest = std::max(longest, n);
        shortest = std::min(shortest, n);
        if (static_cast<int>(stream_base_[s] + k) == main_stream) main = n;
      }
      bytes += keyed_[s]->bytes(row[s]);
    }
    if (longest == 0) {
      ++dropped_empty_;
      continue;
    }
    if ((config_.frame_mode || htk) && shortest != longest) {
      // Frames pair samples of every stream: counts must agree (as CNTK's readers require;
      // HTK features and MLF labels always describe the same frames).
      ++dropped_mismatched_;
      diagnostics_->Report(Severity::kWarning, "frame count mismatch",
                           absl::StrCat("sequence '", key, "' has streams of ", shortest, " and ", longest,
                                        " samples; frame mode needs equal counts; sequence skipped"));
      continue;
    }
    SequenceEntry e;
    e.key = index_.sequences.size();
    e.offset = offset;
    e.line = i;
    e.size = static_cast<uint32_t>(std::min<uint64_t>(bytes, UINT32_MAX));
    e.num_samples = main_stream >= 0 ? main : longest;
    offset += e.size;
    index_.sequences.push_back(e);
    index_.names.push_back(key);
    joined_.insert(joined_.end(), row.begin(), row.end());
  }
  index_.file_size = offset;
  // A CTF/CBF secondary decodes a chunk at a time: joined in an order far from its own, its
  // chunks are parsed again and again (a few are kept). Say so, with what to do.
  const size_t joined = index_.sequences.size();
  for (size_t s = 1; s < ns; ++s) {
    if (joined == 0 || keyed_[s]->ParseUnit(joined_[s]) < 0) continue;
    std::set<int64_t> units;
    uint64_t switches = 0;
    int64_t last = -1;
    for (size_t i = 0; i < joined; ++i) {
      const int64_t u = keyed_[s]->ParseUnit(joined_[i * ns + s]);
      units.insert(u);
      switches += u != last;
      last = u;
    }
    if (switches > 2 * units.size() + 8) {
      diagnostics_->Report(Severity::kWarning, "join order",
                           absl::StrCat(keyed_[s]->description(), " is joined in an order far from its own (its ",
                                        units.size(), " chunks are entered ", switches,
                                        " times): each entry may parse a chunk again; list it first, or "
                                        "write it in the order of ", keyed_[0]->description()));
    }
  }
  uint64_t expansion = 1;
  for (const auto& src : keyed_) expansion = std::max(expansion, src->expansion());
  index_.BuildChunks(std::max<uint64_t>(1, config_.deserializers[0].chunk_size_in_bytes / expansion));
  index_.ComputeContentHash();
  diagnostics_->Flush();
  return absl::OkStatus();
}

uint64_t Dataset::file_bytes() const {
  uint64_t n = 0;
  for (std::string_view v : inputs()) n += v.size();
  return n;
}

std::vector<std::string> Dataset::input_paths() const {
  if (file_) return {file_->path()};
  std::vector<std::string> out;
  for (const auto& s : keyed_) {
    for (std::string& p : s->input_paths()) out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::string_view> Dataset::inputs() const {
  if (file_) return {file_->bytes()};
  std::vector<std::string_view> out;
  for (const auto& s : keyed_) {
    for (std::string_view v : s->inputs()) out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> Dataset::ParseKeyedChunk(uint64_t chunk_id) const {
  const ChunkEntry& ce = index_.chunks[chunk_id];
  auto out = std::make_unique<ParsedChunk>();
  out->chunk_id = chunk_id;
  out->precision = config_.precision;
  out->streams.resize(streams_.size());
  for (size_t k = 0; k < streams_.size(); ++k) {
    out->streams[k].format = streams_[k].format;
    out->streams[k].dim = static_cast<uint32_t>(streams_[k].dim);
  }
  std::vector<ParsedStream*> targets(streams_.size());
  for (size_t k = 0; k < streams_.size(); ++k) targets[k] = &out->streams[k];
  const size_t ns = keyed_.size();
  // A source whose values all lie ready in its input (Kaldi FM/DM in the dataset's
  // precision) is not decoded: the chunk points at them.
  // where[s]: per sequence of the chunk, its values in source s's input; empty when source s decodes.
  // With compressed_in_place, a source whose matrices are all compressed (Kaldi CM, CM2,
  // CM3) is not decoded either: the chunk keeps where they lie, for the assembler.
  std::vector<bool> in_place(ns, false), compressed(ns, false);
  std::vector<std::vector<const std::byte*>> where(ns);
  std::vector<std::vector<CompressedDense>> matrices(ns);
  for (size_t s = 0; s < ns; ++s) {
    if (keyed_[s]->streams().size() != 1 || keyed_[s]->streams()[0].format != StreamFormat::kDense) continue;
    in_place[s] = true;
    for (uint64_t j = 0; j < ce.num_sequences && in_place[s]; ++j) {
      const size_t e = joined_[(ce.first_sequence + j) * ns + s];
      where[s].push_back(keyed_[s]->InPlace(e, config_.precision));
      in_place[s] = where[s].back() != nullptr || keyed_[s]->samples(e, 0) == 0;
    }
    if (in_place[s] || !compressed_in_place_) continue;
    where[s].clear();
    compressed[s] = true;
    for (uint64_t j = 0; j < ce.num_sequences && compressed[s]; ++j) {
      const size_t e = joined_[(ce.first_sequence + j) * ns + s];
      CompressedDense m;
      compressed[s] = keyed_[s]->Compressed(e, &m) || keyed_[s]->samples(e, 0) == 0;
      matrices[s].push_back(m);  // an empty entry's is never read
    }
  }
  // Columns sized once from the sources' sample counts: growing them sequence by sequence
  // re-copies and page-faults every chunk's values several times over.
  for (size_t s = 0; s < ns; ++s) {
    for (size_t k = 0; k < keyed_[s]->streams().size(); ++k) {
      uint64_t samples = 0;
      for (uint64_t j = 0; j < ce.num_sequences; ++j) {
        samples += keyed_[s]->samples(joined_[(ce.first_sequence + j) * ns + s], k);
      }
      ParsedStream& ps = *targets[stream_base_[s] + k];
      ps.sequence_begin.reserve(ce.num_sequences + 1);
      if (in_place[s]) {
        ps.in_place = std::move(where[s]);
        continue;
      }
      if (compressed[s]) {
        ps.compressed = std::move(matrices[s]);
        continue;
      }
      // Dense: dim values a sample; sparse and ids: about one entry a sample (labels).
      const uint64_t values = ps.format == StreamFormat::kDense ? samples * ps.dim : samples;
      if (config_.precision == Precision::kFloat) ps.values_f32.reserve(values);
      else ps.values_f64.reserve(values);
      if (ps.format != StreamFormat::kDense) {
        ps.indices.reserve(samples);
        ps.nnz_begin.reserve(samples + 1);
      }
    }
  }
  for (uint64_t j = 0; j < ce.num_sequences; ++j) {
    const uint64_t i = ce.first_sequence + j;
    for (size_t s = 0; s < ns; ++s) {
      const size_t e = joined_[i * ns + s];
      if (in_place[s] || compressed[s]) {
        ParsedStream& ps = *targets[stream_base_[s]];
        ps.sequence_begin.push_back(ps.sequence_begin.back() + keyed_[s]->samples(e, 0));
        continue;
      }
      RETURN_IF_ERROR(keyed_[s]->Decode(e, config_.precision, targets.data() + stream_base_[s]));
    }
    out->slot_of.push_back(static_cast<int32_t>(j));
    out->keys.push_back(index_.sequences[i].key);
    out->names.push_back(index_.names[i]);
    out->lengths.push_back(index_.sequences[i].num_samples);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> Dataset::ParseChunk(uint64_t chunk_id) const {
  parses_.fetch_add(1);
  if (!keyed_.empty()) return ParseKeyedChunk(chunk_id);
  if (cbf_) return ParseCbfChunk(file_->bytes(), *cbf_, index_, chunk_id, cbf_source_, config_.precision, path());
  return parser_->ParseChunk(file_->bytes(), index_, chunk_id);
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> Dataset::SharedChunk(uint64_t chunk_id) const {
  std::unique_lock<std::mutex> lock(cache_mu_);
  while (true) {
    CacheEntry& e = cache_[chunk_id];
    if (auto live = e.chunk.lock()) {
      RetainLocked(chunk_id, live);
      return live;
    }
    if (!e.parsing) break;
    cache_cv_.wait(lock);  // another reader is parsing it
  }
  cache_[chunk_id].parsing = true;
  lock.unlock();
  auto parsed = ParseChunk(chunk_id);
  // A chunk whose dense values are used where they lie in the mapping (CBF) keeps its pages
  // until it is released; any other chunk is done with them now.
  bool points_into_file = false;
  if (parsed.ok() && file_ != nullptr) {
    for (const ParsedStream& ps : (*parsed)->streams) points_into_file |= !ps.in_place.empty() || !ps.compressed.empty();
  }
  if (!points_into_file) DoneWith(chunk_id);
  lock.lock();
  CacheEntry& e = cache_[chunk_id];
  e.parsing = false;
  cache_cv_.notify_all();
  if (!parsed.ok()) return parsed.status();
  const uint64_t bytes = (*parsed)->MemoryBytes();
  resident_->chunks += 1;
  resident_->bytes += bytes;
  const ChunkEntry& ce = index_.chunks[chunk_id];
  const uint64_t drop_begin = points_into_file ? ce.begin_offset : 0;
  const uint64_t drop_bytes = points_into_file ? ce.end_offset - ce.begin_offset : 0;
  std::shared_ptr<const ParsedChunk> chunk((*parsed).release(), [resident = resident_, bytes, drop_begin,
                                                                  drop_bytes](const ParsedChunk* c) {
    resident->chunks -= 1;
    resident->bytes -= bytes;
    delete c;
    if (drop_bytes > 0) {
      std::lock_guard<std::mutex> guard(resident->mu);
      if (resident->file != nullptr) resident->file->DontNeed(drop_begin, drop_bytes);
    }
  });
  e.chunk = chunk;
  RetainLocked(chunk_id, chunk);
  return chunk;
}

void Dataset::RetainLocked(uint64_t chunk_id, const std::shared_ptr<const ParsedChunk>& chunk) const {
  if (retain_limit_ == 0) return;
  for (auto it = retained_.begin(); it != retained_.end(); ++it) {  // a few entries: a scan is enough
    if (it->chunk_id == chunk_id) {
      retained_.splice(retained_.begin(), retained_, it);
      return;
    }
  }
  const uint64_t bytes = chunk->MemoryBytes();
  if (bytes > retain_limit_) return;
  retained_.push_front(Retained{chunk_id, bytes, chunk});
  retained_bytes_ += bytes;
  // Still held by the caller: dropping the least recent here frees nothing but older chunks,
  // which may be freed under the lock (their deleters take no lock of this dataset).
  DropLeastRecentLocked(retained_bytes_ > retain_limit_ ? retained_bytes_ - retain_limit_ : 0);
}

std::vector<std::shared_ptr<const ParsedChunk>> Dataset::DropLeastRecentLocked(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> dropped;
  uint64_t freed = 0;
  while (freed < bytes && !retained_.empty()) {
    freed += retained_.back().bytes;
    retained_bytes_ -= retained_.back().bytes;
    dropped.push_back(std::move(retained_.back().chunk));
    retained_.pop_back();
  }
  return dropped;
}

void Dataset::SetRetainedBytes(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(cache_mu_);
  retain_limit_ = bytes;
  released = DropLeastRecentLocked(retained_bytes_ > bytes ? retained_bytes_ - bytes : 0);
}

uint64_t Dataset::DropRetained(uint64_t bytes) const {
  std::vector<std::shared_ptr<const ParsedChunk>> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(cache_mu_);
  const uint64_t before = retained_bytes_;
  released = DropLeastRecentLocked(bytes);
  return before - retained_bytes_;
}

uint64_t Dataset::retained_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return retained_bytes_;
}

uint64_t Dataset::ChunkBytes(uint64_t chunk_id) const {
  const ChunkEntry& c = index_.chunks[chunk_id];
  return c.end_offset - c.begin_offset;
}

void Dataset::WillNeed(uint64_t chunk_id) const {
  const ChunkEntry& c = index_.chunks[chunk_id];
  if (!keyed_.empty()) {
    const size_t ns = keyed_.size();
    for (uint64_t i = c.first_sequence; i < c.first_sequence + c.num_sequences; ++i)
      for (size_t s = 0; s < ns; ++s) keyed_[s]->WillNeed(joined_[i * ns + s]);
    return;
  }
  file_->WillNeed(c.begin_offset, c.end_offset - c.begin_offset, /*populate=*/true);  // parsed right after
}

void Dataset::DoneWith(uint64_t chunk_id) const {
  if (!keyed_.empty()) return;  // several files, shared pages: left to the kernel
  const ChunkEntry& c = index_.chunks[chunk_id];
  file_->DontNeed(c.begin_offset, c.end_offset - c.begin_offset);
}

}  // namespace conveyor
