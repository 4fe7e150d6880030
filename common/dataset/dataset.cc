#include "common/dataset/dataset.h"

#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/formats/registry.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetConfig& config,
                                                       const DatasetOpenOptions& options) {
  std::unique_ptr<Dataset> ds(new Dataset(config));
  RETURN_IF_ERROR(ds->Init(options));
  RETURN_IF_ERROR(ds->CheckReads());  // indexing read the files through their mappings
  return ds;
}

Dataset::~Dataset() = default;

absl::Status Dataset::Init(const DatasetOpenOptions& options) {
  if (config_.deserializers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset '", config_.name, "' has no deserializer"));
  }
  diagnostics_ = std::make_unique<Diagnostics>(config_.EffectiveTraceLevel(), options.diagnostics_sink);
  budget_ = std::make_unique<ErrorBudget>(options.max_errors_override.value_or(config_.EffectiveMaxErrors()));
  // Not for datasets read as frames by default: a random frame is a row of 1-byte CM values,
  // each decoded alone (no per-column table to amortize), which costs the host more than
  // decoding whole utterances at parse time (bench/RESULTS.md, staging_bench). Sources whose
  // frames decode alone as cheaply (HTK) are left in place for frames too.
  compressed_in_place_ = options.compressed_in_place && !config_.frame_mode && !options.reads_frames;
  by_frame_in_place_ = options.compressed_in_place;
  RETURN_IF_ERROR(OpenDeserializers(options));
  path_ = deserializers_[0]->description();
  if (deserializers_.size() == 1 && deserializers_[0]->chunks() != nullptr) {
    // One deserializer that chunks its input itself: its chunks are the dataset's.
    chunked_ = deserializers_[0].get();
    streams_ = chunked_->streams();
    index_ = chunked_->chunks();
    cache_ = std::make_unique<ChunkCache>([this](uint64_t c) { return ParseChunk(c); }, nullptr);
    return absl::OkStatus();
  }
  cache_ = std::make_unique<ChunkCache>([this](uint64_t c) { return ParseChunk(c); }, nullptr);
  return InitJoined();
}

absl::Status Dataset::OpenDeserializers(const DatasetOpenOptions& options) {
  const DeserializerRegistry& registry = DeserializerRegistry::Global();
  const bool member = config_.deserializers.size() > 1;
  for (const DeserializerConfig& d : config_.deserializers) {
    DeserializerContext context{d, config_, d.base_dir, diagnostics_.get(), budget_.get(), options.progress, options, member};
    ASSIGN_OR_RETURN(std::unique_ptr<Deserializer> deserializer, registry.Open(context));
    deserializers_.push_back(std::move(deserializer));
  }
  return absl::OkStatus();
}

absl::Status Dataset::InitJoined() {
  for (const auto& src : deserializers_) {
    stream_base_.push_back(streams_.size());
    for (const StreamConfig& sc : src->streams()) streams_.push_back(sc);
    SourceStats st;
    st.type = config_.deserializers[source_stats_.size()].type;
    st.description = src->description();
    st.entries = src->size();
    st.skipped = src->skipped();
    source_stats_.push_back(st);
  }
  JoinByKey();
  WarnJoinOrder();
  uint64_t expansion = 1;
  for (const auto& src : deserializers_) expansion = std::max(expansion, src->expansion());
  joined_index_.BuildChunks(std::max<uint64_t>(1, config_.deserializers[0].chunk_size_in_bytes / expansion));
  joined_index_.ComputeContentHash();
  diagnostics_->Flush();
  return absl::OkStatus();
}

void Dataset::JoinByKey() {
  const size_t ns = deserializers_.size();
  const auto& sources = deserializers_;
  bool aligned = false;  // frames of every stream pair one to one (HTK features and labels)
  for (const auto& src : deserializers_) aligned = aligned || src->aligned_frames();
  // Secondary sources by key (the first of repeated keys).
  std::vector<std::unordered_map<std::string_view, uint32_t>> by_key(ns);
  for (size_t s = 1; s < ns; ++s) {
    by_key[s].reserve(sources[s]->size());
    for (size_t j = 0; j < sources[s]->size(); ++j) {
      if (!by_key[s].emplace(sources[s]->key(j), static_cast<uint32_t>(j)).second) {
        ++source_stats_[s].duplicates;
        diagnostics_->Report(Severity::kWarning, "repeated key",
                             absl::StrCat(sources[s]->description(), ": key '", sources[s]->key(j),
                                          "' appears again; its first entry is used"));
      }
    }
  }
  int main_stream = -1;
  for (size_t k = 0; k < streams_.size(); ++k)
    if (streams_[k].defines_mb_size) main_stream = static_cast<int>(k);
  std::vector<uint32_t> row(ns);
  uint64_t offset = 0;
  for (size_t i = 0; i < sources[0]->size(); ++i) {
    const std::string& key = sources[0]->key(i);
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
                             absl::StrCat(sources[s]->description(), " has no entry '", key, "' of ",
                                          sources[0]->description(), "; sequence skipped"));
      } else {
        row[s] = it->second;
      }
    }
    if (missing) continue;
    uint32_t longest = 0, shortest = UINT32_MAX, main = 0;
    uint64_t bytes = 0;
    for (size_t s = 0; s < ns; ++s) {
      for (size_t k = 0; k < sources[s]->streams().size(); ++k) {
        const uint32_t n = sources[s]->samples(row[s], k);
        longest = std::max(longest, n);
        shortest = std::min(shortest, n);
        if (static_cast<int>(stream_base_[s] + k) == main_stream) main = n;
      }
      bytes += sources[s]->bytes(row[s]);
    }
    if (longest == 0) {
      ++dropped_empty_;
      continue;
    }
    if ((config_.frame_mode || aligned) && shortest != longest) {
      // Frames pair samples of every stream: counts must agree (as CNTK's readers require;
      // HTK features and MLF labels always describe the same frames).
      ++dropped_mismatched_;
      diagnostics_->Report(Severity::kWarning, "frame count mismatch",
                           absl::StrCat("sequence '", key, "' has streams of ", shortest, " and ", longest,
                                        " samples; frame mode needs equal counts; sequence skipped"));
      continue;
    }
    SequenceEntry e;
    e.key = joined_index_.sequences.size();
    e.offset = offset;
    e.line = i;
    e.size = static_cast<uint32_t>(std::min<uint64_t>(bytes, UINT32_MAX));
    e.num_samples = main_stream >= 0 ? main : longest;
    offset += e.size;
    joined_index_.sequences.push_back(e);
    joined_index_.names.push_back(key);
    joined_.insert(joined_.end(), row.begin(), row.end());
  }
  joined_index_.file_size = offset;
}

void Dataset::WarnJoinOrder() {
  const size_t ns = deserializers_.size();
  const auto& sources = deserializers_;
  // A CTF/CBF secondary decodes a chunk at a time: joined in an order far from its own, its
  // chunks are parsed again and again (a few are kept). Say so, with what to do.
  const size_t joined = joined_index_.sequences.size();
  for (size_t s = 1; s < ns; ++s) {
    if (joined == 0 || sources[s]->ParseUnit(joined_[s]) < 0) continue;
    std::set<int64_t> units;
    uint64_t switches = 0;
    int64_t last = -1;
    for (size_t i = 0; i < joined; ++i) {
      const int64_t u = sources[s]->ParseUnit(joined_[i * ns + s]);
      units.insert(u);
      switches += u != last;
      last = u;
    }
    if (switches > 2 * units.size() + 8) {
      diagnostics_->Report(Severity::kWarning, "join order",
                           absl::StrCat(sources[s]->description(), " is joined in an order far from its own (its ",
                                        units.size(), " chunks are entered ", switches,
                                        " times): each entry may parse a chunk again; list it first, or "
                                        "write it in the order of ", sources[0]->description()));
    }
  }
}

uint64_t Dataset::file_bytes() const {
  uint64_t n = 0;
  for (std::string_view v : inputs()) n += v.size();
  return n;
}

std::vector<std::string> Dataset::input_paths() const {
  std::vector<std::string> out;
  for (const auto& s : deserializers_) {
    for (std::string& p : s->input_paths()) out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::string_view> Dataset::inputs() const {
  std::vector<std::string_view> out;
  for (const auto& s : deserializers_) {
    for (std::string_view v : s->inputs()) out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> Dataset::ParseJoinedChunk(uint64_t chunk_id) const {
  const ChunkEntry& ce = joined_index_.chunks[chunk_id];
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
  const size_t ns = deserializers_.size();
  const auto& sources = deserializers_;
  // A source whose values all lie ready in its input (Kaldi FM/DM in the dataset's
  // precision) is not decoded: the chunk points at them.
  // where[s]: per sequence of the chunk, its values in source s's input; empty when source s decodes.
  // With compressed_in_place, a source whose entries are all left for the assembler (Kaldi
  // CM, CM2, CM3; HTK features) is not decoded either: the chunk keeps where they lie.
  std::vector<bool> in_place(ns, false), compressed(ns, false);
  std::vector<HugeVector<const std::byte*>> where(ns);
  std::vector<std::vector<CompressedDense>> matrices(ns);
  for (size_t s = 0; s < ns; ++s) {
    if (sources[s]->streams().size() != 1 || sources[s]->streams()[0].format != StreamFormat::kDense) continue;
    in_place[s] = true;
    for (uint64_t j = 0; j < ce.num_sequences && in_place[s]; ++j) {
      const size_t e = joined_[(ce.first_sequence + j) * ns + s];
      where[s].push_back(sources[s]->InPlace(e, config_.precision));
      in_place[s] = where[s].back() != nullptr || sources[s]->samples(e, 0) == 0;
    }
    if (in_place[s] || !(sources[s]->CompressedByFrame() ? by_frame_in_place_ : compressed_in_place_)) continue;
    where[s].clear();
    compressed[s] = true;
    for (uint64_t j = 0; j < ce.num_sequences && compressed[s]; ++j) {
      const size_t e = joined_[(ce.first_sequence + j) * ns + s];
      CompressedDense m;
      compressed[s] = sources[s]->Compressed(e, &m) || sources[s]->samples(e, 0) == 0;
      matrices[s].push_back(m);  // an empty entry's is never read
    }
  }
  // Columns sized once from the sources' sample counts: growing them sequence by sequence
  // re-copies and page-faults every chunk's values several times over.
  for (size_t s = 0; s < ns; ++s) {
    for (size_t k = 0; k < sources[s]->streams().size(); ++k) {
      uint64_t samples = 0;
      for (uint64_t j = 0; j < ce.num_sequences; ++j) {
        samples += sources[s]->samples(joined_[(ce.first_sequence + j) * ns + s], k);
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
        ps.sequence_begin.push_back(ps.sequence_begin.back() + sources[s]->samples(e, 0));
        continue;
      }
      RETURN_IF_ERROR(sources[s]->Decode(e, config_.precision, targets.data() + stream_base_[s]));
    }
    out->slot_of.push_back(static_cast<int32_t>(j));
    out->keys.push_back(joined_index_.sequences[i].key);
    out->names.push_back(joined_index_.names[i]);
    out->lengths.push_back(joined_index_.sequences[i].num_samples);
  }
  // Read through the files' mappings (values decoded now, or used in place at assembly): none
  // of those files rewritten in place since it was opened. After the decode: a write updates
  // the mtime before its bytes, so any new byte read above shows here.
  std::vector<size_t> entries(ce.num_sequences);
  for (size_t s = 0; s < ns; ++s) {
    for (uint64_t j = 0; j < ce.num_sequences; ++j) entries[j] = joined_[(ce.first_sequence + j) * ns + s];
    RETURN_IF_ERROR(sources[s]->CheckUnchanged(entries));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> Dataset::ParseChunk(uint64_t chunk_id) const {
  parses_.fetch_add(1);
  // The chunk's bad sequences count against maxErrors once, not at every parse of it.
  ErrorBudget::ChunkScope scope(budget_.get(), chunk_id);
  auto chunk = chunked_ == nullptr ? ParseJoinedChunk(chunk_id) : chunked_->ParseChunk(chunk_id);
  if (chunk.ok()) {
    // Kaldi and HTK chunks are read through their files' mappings: not from a file cut short.
    RETURN_IF_ERROR(CheckReads());
    NoteOneSampleStreams(chunk->get());
    NoteIdentitySlots(chunk->get());
  }
  return chunk;
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> Dataset::SharedChunk(uint64_t chunk_id, bool* parsed_here) const {
  return cache_->Get(chunk_id, parsed_here);
}

uint64_t Dataset::ChunkBytes(uint64_t chunk_id) const {
  const ChunkEntry& c = index_->chunks[chunk_id];
  return c.end_offset - c.begin_offset;
}

void Dataset::WillNeed(uint64_t chunk_id) const {
  if (chunked_ != nullptr) return;  // its parse reads the chunk whole (ChunkedFileDeserializer::ReadChunk)
  const ChunkEntry& c = index_->chunks[chunk_id];
  const size_t ns = deserializers_.size();
  for (uint64_t i = c.first_sequence; i < c.first_sequence + c.num_sequences; ++i)
    for (size_t s = 0; s < ns; ++s) deserializers_[s]->WillNeed(joined_[i * ns + s]);
}

absl::Status Dataset::CheckReads() const {
  const uint64_t n = MappedFile::CutShortReads();
  if (n == reads_checked_.load(std::memory_order_acquire) && !cut_short_.load(std::memory_order_acquire)) {
    return absl::OkStatus();  // no read past a file's end anywhere since the last look
  }
  std::vector<std::string> paths = input_paths();
  if (!index_cache_path().empty()) paths.push_back(index_cache_path());  // mapped and used in place
  absl::Status st = MappedFile::CheckReads(paths);
  if (!st.ok()) {
    cut_short_.store(true, std::memory_order_release);
    return st;
  }
  // (Faults of other datasets' files: this one's stay readable.)
  uint64_t seen = reads_checked_.load(std::memory_order_relaxed);
  while (seen < n && !reads_checked_.compare_exchange_weak(seen, n, std::memory_order_acq_rel)) {
  }
  return absl::OkStatus();
}

}  // namespace conveyor
