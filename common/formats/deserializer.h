// deserializer.h: the one interface every input format implements (in the spirit of CNTK's
// IDataDeserializer), and the one context every format's factory is opened with. A
// Dataset (common/dataset/) opens its configured deserializers through the registry
// (registry.h) by type name and knows nothing else of them:
//  - stream descriptions: streams(), formats and dims resolved once open;
//  - chunk descriptions: a deserializer that cuts its input into chunks itself (CTF, CBF)
//    exposes its index (chunks()) and parses a chunk at a time (ParseChunk);
//  - sequences by key: every deserializer of a composite (several joined by key, or one
//    without chunks of its own: Kaldi, HTK, MLF) lists its sequences by key and decodes one
//    sequence at a time into a chunk's columns (Decode);
//  - optional capabilities: values used in place from the mapping (InPlace), compressed
//    payloads left for the assembler to decode (Compressed).
// Opening a deserializer scans what it needs completely (every length checked), so that
// ParseChunk and Decode meet malformed input only where the format parses lazily (CTF text,
// within maxErrors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/chunk/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/error_budget.h"
#include "common/index/index.h"
#include "common/log.h"

namespace conveyor {

// How a dataset is opened, handed on to each of its deserializers.
struct DatasetOpenOptions {
  int index_threads = 0;  // 0: hardware concurrency
  // Progress of the index pass: (bytes scanned, total bytes). Called from worker threads.
  std::function<void(uint64_t, uint64_t)> progress;
  Diagnostics::Sink diagnostics_sink;  // default: stderr
  // Replaces the configured maxErrors (`conveyor inspect` counts every error).
  std::optional<uint64_t> max_errors_override;
  // Values a format leaves for the assembler to decode (ParsedStream::compressed): Kaldi
  // compressed matrices (CM, CM2, CM3), which the CUDA assembler decodes on the device, and
  // HTK features, whose context windows are built as they are written into the batch; the
  // parser threads only locate them. Any assembler reads such chunks (the CPU one decodes as
  // it copies). Where frames are read (frameMode: true, or `reads_frames`), only payloads
  // that decode a frame at a time as cheaply as whole (Deserializer::CompressedByFrame: HTK)
  // are left: see dataset.cc.
  bool compressed_in_place = false;
  // The reads will take frames (a request's frame mode, where the configuration says
  // utterances): as frameMode: true for compressed_in_place.
  bool reads_frames = false;
};

// How a deserializer's index was obtained, for `conveyor index` / `inspect` to report.
enum class IndexSource { kBuilt, kCache, kRebuiltStaleCache, kRebuiltBadCache };

// Everything a format's factory gets. Borrowed: every pointer and reference lives as long as
// the opened deserializer (the Dataset owns them all).
struct DeserializerContext {
  const DeserializerConfig& config;  // its node of the configuration
  const DatasetConfig& dataset;      // the dataset it belongs to (precision, maxErrors, allowPipes...)
  std::string base_dir;              // relative paths of its lists resolve against it
  Diagnostics* diagnostics = nullptr;
  ErrorBudget* budget = nullptr;
  // (bytes scanned, total bytes) while opening; may be empty. Called from worker threads.
  std::function<void(uint64_t, uint64_t)> progress;
  const DatasetOpenOptions& options;
  // One of several deserializers joined by key (a composite): its sequences are read by key
  // (size(), key(), Decode()) even where it has chunks of its own.
  bool member = false;
};

class Deserializer {
 public:
  virtual ~Deserializer() = default;

  // Stream descriptions: its streams, formats and dims resolved (a dim left to the data is
  // known once open).
  virtual const std::vector<StreamConfig>& streams() const = 0;

  // --- Chunk descriptions (deserializers that chunk their input themselves: CTF, CBF).
  // Its index (sequences and chunks), or null when it is read by key only.
  virtual const Index* chunks() const { return nullptr; }
  // Parses chunk `chunk_id` of chunks(). Thread-safe. Errors: DataLoss (input errors beyond
  // maxErrors, corrupt input).
  virtual absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(uint64_t chunk_id) const;
  // Where chunks() came from (the index cache or a fresh pass), and the cache file.
  virtual IndexSource index_source() const { return IndexSource::kBuilt; }
  virtual const std::string& index_cache_path() const;

  // --- Sequences by key (every member of a composite).
  virtual size_t size() const = 0;
  virtual const std::string& key(size_t i) const = 0;
  // Samples of sequence i in stream k of this deserializer.
  virtual uint32_t samples(size_t i, size_t k) const = 0;
  // Bytes of input sequence i occupies (chunking and throughput accounting).
  virtual uint64_t bytes(size_t i) const = 0;
  // Appends sequence i to out[k] for every stream k of this deserializer, values in `precision`.
  virtual absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const = 0;

  // --- Optional capabilities.
  // For a deserializer of one dense stream: where sequence i's values lie in its input,
  // already in `precision`, row-major and contiguous, so that they can be used without
  // decoding (ParsedStream::in_place); null when they must be decoded.
  virtual const std::byte* InPlace(size_t, Precision) const { return nullptr; }
  // Entry `i`'s dense values as a compressed payload the assembler can decode (a codec
  // registered by the format, chunk/codec.h); false when it is stored otherwise.
  virtual bool Compressed(size_t, CompressedDense*) const { return false; }
  // Its Compressed() payloads decode a frame at a time about as cheaply per value as whole
  // (HTK: a frame is one load of its bytes), so that they are left for the assembler in frame
  // mode too; false where a lone frame costs much more (Kaldi CM: per-column headers).
  virtual bool CompressedByFrame() const { return false; }
  // Bytes a parsed sequence holds per input byte, when far above 1 (an HTK context window
  // repeats every frame window-fold): chunks are cut smaller by as much, so that a chunk's
  // parsed size, not its input, stays near chunkSizeInBytes (the same chunks when the values
  // are left for the assembler: the output does not depend on it).
  virtual uint64_t expansion() const { return 1; }
  // Its samples are frames that pair one to one with the other deserializers' (HTK
  // features and MLF labels describe the same frames): a joined sequence whose streams'
  // counts differ is dropped, as in frame mode.
  virtual bool aligned_frames() const { return false; }
  virtual void WillNeed(size_t) const {}
  // After entries were decoded from files read through their mappings (Kaldi archives, HTK
  // feature files): OK unless a file one of `entries` lies in was rewritten or cut in place
  // since it was opened (MappedFile::CheckUnchanged, each file once); DataLoss naming it then.
  virtual absl::Status CheckUnchanged(absl::Span<const size_t>) const { return absl::OkStatus(); }
  // Deserializers that decode whole units (a CTF/CBF member parses a chunk at a time): the
  // unit entry i lies in, so that a join can tell how often its order makes it re-parse;
  // -1 for deserializers that decode entries one by one (Kaldi, HTK, MLF).
  virtual int64_t ParseUnit(size_t) const { return -1; }

  // The bytes of every input it reads (files, pipe outputs), for benchmarks' references.
  virtual std::vector<std::string_view> inputs() const = 0;
  // The files behind inputs(), in the same order; "" for an input that is no file (a pipe).
  virtual std::vector<std::string> input_paths() const = 0;
  // What it reads, for messages ("scp:data/feats.scp", a data file's path).
  virtual std::string description() const = 0;
  // Entries dropped while opening (unreadable entries within maxErrors or Kaldi's `p`).
  virtual uint64_t skipped() const { return 0; }
};

// The one factory signature of every format. Errors: those of opening its input (NotFound,
// InvalidArgument for its configuration, DataLoss beyond maxErrors).
using DeserializerFactory = absl::StatusOr<std::unique_ptr<Deserializer>> (*)(const DeserializerContext& context);

}  // namespace conveyor
