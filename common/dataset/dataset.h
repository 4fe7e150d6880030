// dataset.h: an opened dataset: its deserializer's file mapped, its index built (or loaded
// from the index cache), its error budget and diagnostics, and the parser that turns one
// chunk into a ParsedChunk. Everything above it (planner, pipeline, assembler, service)
// sees only this class.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batch/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/error_budget.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/formats/ctf/ctf_parser.h"
#include "common/formats/keyed_source.h"
#include "common/index/index.h"
#include "common/log.h"
#include "common/mapped_file.h"

namespace conveyor {

struct DatasetOpenOptions {
  int index_threads = 0;  // 0: hardware concurrency
  // Progress of the index pass: (bytes scanned, total bytes). Called from worker threads.
  std::function<void(uint64_t, uint64_t)> progress;
  Diagnostics::Sink diagnostics_sink;  // default: stderr
  // Replaces the configured maxErrors (`conveyor inspect` counts every error).
  std::optional<uint64_t> max_errors_override;
  // Kaldi compressed matrices (CM, CM2, CM3) stay compressed in parsed chunks
  // (ParsedStream::compressed): the CUDA assembler decodes them on the device, so the parser
  // threads only locate them. Any assembler reads such chunks (the CPU one decodes). Not
  // applied to datasets configured to read frames (frameMode: true): see dataset.cc.
  bool compressed_in_place = false;
};

// How the index was obtained, for `conveyor index` / `inspect` to report.
enum class IndexSource { kBuilt, kCache, kRebuiltStaleCache, kRebuiltBadCache };

// Per deserializer of a keyed (Kaldi, HTK) dataset: what joining by key kept and dropped.
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
  const Index& index() const { return index_; }
  const std::vector<StreamConfig>& streams() const { return streams_; }
  // The data file (CTF, CBF) or the primary deserializer's description (keyed formats).
  const std::string& path() const { return path_; }
  // Bytes of all its input files.
  uint64_t file_bytes() const;
  // Every input's bytes (the mapped file; a keyed dataset's files and pipe outputs).
  std::vector<std::string_view> inputs() const;
  // The files behind inputs(), in the same order; "" for an input that is no file (a pipe).
  std::vector<std::string> input_paths() const;
  std::string_view bytes() const { return file_ ? file_->bytes() : std::string_view(); }
  // Keyed datasets: per-deserializer counts, and sequences dropped by the join.
  const std::vector<SourceStats>& source_stats() const { return source_stats_; }
  uint64_t dropped_mismatched() const { return dropped_mismatched_; }  // frame counts differ
  uint64_t dropped_empty() const { return dropped_empty_; }            // no samples at all
  IndexSource index_source() const { return index_source_; }
  const std::string& index_cache_path() const { return cache_path_; }
  Diagnostics& diagnostics() const { return *diagnostics_; }
  uint64_t errors() const { return budget_->spent(); }
  uint64_t max_errors() const { return budget_->max_errors(); }
  // Gives back errors counted by a pass that does not count as reading (a composite's scan).
  void RefundErrors(uint64_t n) const { budget_->Refund(n); }

  // Parses chunk `chunk_id`. Thread-safe. Errors: DataLoss once maxErrors is exceeded.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(uint64_t chunk_id) const;

  // Whether Kaldi compressed matrices stay compressed in its chunks (DatasetOpenOptions).
  bool compressed_in_place() const { return compressed_in_place_; }

  // The parsed chunk, shared by every reader of this dataset: a chunk some reader still
  // holds is not parsed again, and concurrent requests for one chunk parse it once (readers
  // of different ranks, or several subscriptions to one stream, share the work). Nothing is
  // kept once no reader holds it. Thread-safe. Errors: as ParseChunk.
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> SharedChunk(uint64_t chunk_id) const;
  // Chunks actually parsed so far (cache hits excluded).
  uint64_t parses() const { return parses_.load(); }
  // Keeps up to `bytes` of the most recently used chunks after their last reader lets go
  // (least recently used dropped first), so that readers a few chunks apart (ranks of one
  // job on one host, DataLoader workers) share one parse. 0 (the default): nothing is kept.
  void SetRetainedBytes(uint64_t bytes) const;
  // Drops retained chunks, least recently used first, until at least `bytes` are dropped or
  // none is left; returns the bytes dropped (a chunk a reader still holds stays resident).
  uint64_t DropRetained(uint64_t bytes) const;
  uint64_t retained_bytes() const;
  // Parsed chunks held by readers right now, and their heap bytes (the chunk cache's
  // occupancy: it holds nothing no reader holds).
  uint64_t resident_chunks() const { return resident_->chunks.load(); }
  uint64_t resident_bytes() const { return resident_->bytes.load(); }

  // The byte range of a chunk in the file (for readahead and accounting).
  uint64_t ChunkBytes(uint64_t chunk_id) const;
  void WillNeed(uint64_t chunk_id) const;
  // The chunk's text was parsed: drop its pages from the mapping.
  void DoneWith(uint64_t chunk_id) const;

 private:
  Dataset(DatasetConfig config) : config_(std::move(config)) {}
  absl::Status Init(const DatasetOpenOptions& options);
  absl::Status InitCbf(const DatasetOpenOptions& options);
  absl::Status InitKeyed(const DatasetOpenOptions& options);
  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseKeyedChunk(uint64_t chunk_id) const;

  const DatasetConfig config_;
  std::vector<StreamConfig> streams_;
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  // Keyed datasets: the sources, and per joined sequence the entry of each source
  // (joined_[i * keyed_.size() + s]); stream_base_[s]: the first stream of source s.
  std::vector<std::unique_ptr<KeyedSource>> keyed_;
  std::vector<uint32_t> joined_;
  std::vector<size_t> stream_base_;
  std::vector<SourceStats> source_stats_;
  bool compressed_in_place_ = false;
  uint64_t dropped_mismatched_ = 0, dropped_empty_ = 0;
  Index index_;
  IndexSource index_source_ = IndexSource::kBuilt;
  std::string cache_path_;
  std::unique_ptr<Diagnostics> diagnostics_;
  std::unique_ptr<ErrorBudget> budget_;
  std::unique_ptr<CtfParser> parser_;
  std::unique_ptr<CbfFile> cbf_;         // CNTKBinary: the file's header and chunk table
  std::vector<int> cbf_source_;          // per stream: the file stream it reads
  struct CacheEntry {
    std::weak_ptr<const ParsedChunk> chunk;
    bool parsing = false;
  };
  mutable std::mutex cache_mu_;
  mutable std::condition_variable cache_cv_;
  mutable std::map<uint64_t, CacheEntry> cache_;
  mutable std::atomic<uint64_t> parses_{0};
  // Recently used chunks held for readers to come (SetRetainedBytes), most recent first.
  struct Retained {
    uint64_t chunk_id, bytes;
    std::shared_ptr<const ParsedChunk> chunk;
  };
  void RetainLocked(uint64_t chunk_id, const std::shared_ptr<const ParsedChunk>& chunk) const;
  // Drops retained chunks, least recent first, until `bytes` are dropped; returns them.
  std::vector<std::shared_ptr<const ParsedChunk>> DropLeastRecentLocked(uint64_t bytes) const;
  mutable std::list<Retained> retained_;
  mutable uint64_t retained_bytes_ = 0, retain_limit_ = 0;
  struct Resident {  // shared with the chunks' deleters, which may outlive the dataset
    std::atomic<uint64_t> chunks{0}, bytes{0};
    // Chunks that point into the mapping (dense values used in place) have their pages
    // dropped when they are released, not after parsing. Null once the dataset is gone.
    std::mutex mu;
    const MappedFile* file = nullptr;
  };
  std::shared_ptr<Resident> resident_ = std::make_shared<Resident>();
};

}  // namespace conveyor
