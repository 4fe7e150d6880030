// dataset.h: an opened dataset: its deserializers (deserializer.h, opened by type name
// through the registry), joined by key and chunked when there are several (or one without
// chunks of its own), its error budget and diagnostics, and the chunk cache shared by its
// readers. It knows no format. Everything above it (planner, pipeline, assembler, service)
// sees only this class.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/chunk_cache.h"
#include "common/chunk/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/error_budget.h"
#include "common/formats/deserializer.h"
#include "common/index/index.h"
#include "common/log.h"

namespace conveyor {

// Per deserializer of a joined (composite, Kaldi, HTK) dataset: what joining by key kept and dropped.
struct SourceStats {
  std::string type, description;
  uint64_t entries = 0;     // readable entries (sequences) it has
  uint64_t skipped = 0;     // unreadable entries dropped while opening (maxErrors, Kaldi `p`)
  uint64_t missing = 0;     // keys of the primary deserializer this one lacks (secondaries)
  uint64_t duplicates = 0;  // repeated keys (secondaries: the first one is used)
};

class Dataset {
 public:
  // Opens `config`. Errors: NotFound (data file), InvalidArgument (config, UTF-16 file),
  // Unimplemented (a deserializer this build lacks), DataLoss (input
  // errors beyond maxErrors found by the index pass, e.g. blank rows).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const DatasetConfig& config,
                                                       const DatasetOpenOptions& options = {});
  ~Dataset();

  const DatasetConfig& config() const { return config_; }
  const Index& index() const { return *index_; }
  const std::vector<StreamConfig>& streams() const { return streams_; }
  // The data file (CTF, CBF) or the primary deserializer's description (keyed formats).
  const std::string& path() const { return path_; }
  // Bytes of all its input files.
  uint64_t file_bytes() const;
  // Every input's bytes (the mapped file; a keyed dataset's files and pipe outputs).
  std::vector<std::string_view> inputs() const;
  // The files behind inputs(), in the same order; "" for an input that is no file (a pipe).
  std::vector<std::string> input_paths() const;
  // The data file's bytes (a dataset of one deserializer with chunks of its own), else empty.
  std::string_view bytes() const { return chunked_ ? chunked_->inputs()[0] : std::string_view(); }
  // Keyed datasets: per-deserializer counts, and sequences dropped by the join.
  const std::vector<SourceStats>& source_stats() const { return source_stats_; }
  uint64_t dropped_mismatched() const { return dropped_mismatched_; }  // frame counts differ
  uint64_t dropped_empty() const { return dropped_empty_; }            // no samples at all
  IndexSource index_source() const { return chunked_ ? chunked_->index_source() : IndexSource::kBuilt; }
  const std::string& index_cache_path() const { return chunked_ ? chunked_->index_cache_path() : no_cache_path_; }
  Diagnostics& diagnostics() const { return *diagnostics_; }
  uint64_t errors() const { return budget_->spent(); }
  uint64_t max_errors() const { return budget_->max_errors(); }
  // Gives back errors counted by a pass that does not count as reading (a composite's scan).
  void RefundErrors(uint64_t n) const { budget_->Refund(n); }

  // Parses chunk `chunk_id`. Thread-safe. Errors: DataLoss once maxErrors is exceeded.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(uint64_t chunk_id) const;

  // Whether Kaldi compressed matrices stay compressed in its chunks (DatasetOpenOptions; HTK
  // frames stay in their files whenever compressed_in_place was asked for, frames or not).
  bool compressed_in_place() const { return compressed_in_place_; }

  // The parsed chunk, shared by every reader of this dataset: a chunk some reader still
  // holds is not parsed again, and concurrent requests for one chunk parse it once (readers
  // of different ranks, or several subscriptions to one stream, share the work). Nothing is
  // kept once no reader holds it. Thread-safe. Errors: as ParseChunk.
  // `parsed_here`, when given: whether this call parsed it (ChunkCache::Get).
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> SharedChunk(uint64_t chunk_id, bool* parsed_here = nullptr) const;
  // OK unless one of its files was cut short after it was opened and a read of its mapping
  // found no data there (MappedFile::CheckReads): then DataLoss naming the file, from then on.
  // Called after every parse and by the loader after every batch (Kaldi FM/DM and CBF values
  // are assembled from where they lie). One atomic load while no file anywhere was cut short.
  absl::Status CheckReads() const;

  // Chunks actually parsed so far (cache hits excluded).
  uint64_t parses() const { return parses_.load(); }
  // Keeps up to `bytes` of the most recently used chunks after their last reader lets go
  // (least recently used dropped first), so that readers a few chunks apart (ranks of one
  // job on one host, DataLoader workers) share one parse. 0 (the default): nothing is kept.
  void SetRetainedBytes(uint64_t bytes) const { cache_->SetRetainedBytes(bytes); }
  // Drops retained chunks, least recently used first, until at least `bytes` are dropped or
  // none is left; returns the bytes dropped (a chunk a reader still holds stays resident).
  uint64_t DropRetained(uint64_t bytes) const { return cache_->DropRetained(bytes); }
  // Drops retained chunks no reader holds until `bytes` are freed (ChunkCache::DropUnheld).
  uint64_t DropUnheld(uint64_t bytes) const { return cache_->DropUnheld(bytes); }
  // Whether the chunk is in memory now (a reader holds it, or it is retained).
  bool HoldsChunk(uint64_t chunk_id) const { return cache_->Holds(chunk_id); }
  uint64_t retained_bytes() const { return cache_->retained_bytes(); }
  // Parsed chunks held by readers right now, and their heap bytes (the chunk cache's
  // occupancy: it holds nothing no reader holds).
  uint64_t resident_chunks() const { return cache_->resident_chunks(); }
  uint64_t resident_bytes() const { return cache_->resident_bytes(); }

  // The byte range of a chunk in the file (for readahead and accounting).
  uint64_t ChunkBytes(uint64_t chunk_id) const;
  // Readahead of a chunk about to be parsed (sources read through their mappings).
  void WillNeed(uint64_t chunk_id) const;

 private:
  Dataset(DatasetConfig config) : config_(std::move(config)) {}
  absl::Status Init(const DatasetOpenOptions& options);
  absl::Status OpenDeserializers(const DatasetOpenOptions& options);
  // Several deserializers (or one without chunks of its own): sequences joined by key.
  absl::Status InitJoined();
  // joined_, index_ sequences: the primary's sequences found in every other deserializer.
  void JoinByKey();
  // Warns when a deserializer that parses whole chunks is joined far from its own order.
  void WarnJoinOrder();
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseJoinedChunk(uint64_t chunk_id) const;

  const DatasetConfig config_;
  std::vector<StreamConfig> streams_;
  std::string path_;
  std::unique_ptr<Diagnostics> diagnostics_;
  std::unique_ptr<ErrorBudget> budget_;
  // Its deserializers, in configuration order (the first is the primary of a join).
  std::vector<std::unique_ptr<Deserializer>> deserializers_;
  // The one deserializer whose own chunks are the dataset's; null for a joined dataset.
  const Deserializer* chunked_ = nullptr;
  // Joined datasets: per joined sequence the entry of each deserializer
  // (joined_[i * deserializers_.size() + s]); stream_base_[s]: the first stream of deserializer s.
  std::vector<uint32_t> joined_;
  std::vector<size_t> stream_base_;
  std::vector<SourceStats> source_stats_;
  bool compressed_in_place_ = false;
  bool by_frame_in_place_ = false;  // for sources whose payloads decode by frame as cheaply
  uint64_t dropped_mismatched_ = 0, dropped_empty_ = 0;
  Index joined_index_;
  const Index* index_ = &joined_index_;  // chunked_'s index, or joined_index_
  const std::string no_cache_path_;
  mutable std::atomic<uint64_t> parses_{0};
  mutable std::atomic<uint64_t> reads_checked_{0};  // MappedFile::CutShortReads() at the last look
  mutable std::atomic<bool> cut_short_{false};       // a file of its was found cut short
  // Declared last: destroyed first, so that no chunk released later reaches a deserializer.
  std::unique_ptr<ChunkCache> cache_;
};

}  // namespace conveyor
