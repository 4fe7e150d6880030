// dataset_config.h: the in-memory form of a conveyor configuration (docs/design.md section 3):
// the daemon's listen address and the datasets it serves, with CNTK's parameter names and
// defaults. Loaders (config_loader.h) produce it from YAML/JSON or a BrainScript reader block.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config/stream_types.h"

namespace conveyor {

// One input stream of a deserializer.
struct StreamConfig {
  std::string name;   // what the stream is called in batches and dumps
  std::string alias;  // what the file calls it (CTF `|alias`); defaults to `name`
  StreamFormat format = StreamFormat::kDense;
  uint64_t dim = 0;   // dense: values per sample; sparse: bound on indices
  bool defines_mb_size = false;
  bool dim_given = true;     // KaldiTable: dim 0 means "take it from the data"
  // HTKFeature: the scp file and the context window (frames left/right; -1: inferred from
  // dim / the files' feature dim). HTKMLF: the MLF (text or binary) and the state list.
  std::string scp_file{}, mlf_file{}, label_mapping_file{};
  int context_left = -1, context_right = -1;
  uint64_t frame_shift = 100000;  // MLF times per frame, in 100 ns units (10 ms)
  bool format_given = true;  // CNTKBinary: format/dim may be left to the file (false, dim 0)
};

// How ranks share a global minibatch (docs/randomization.md section 5). kBalanced: its units
// are dealt to the ranks, each to the rank with the fewest samples so far (every rank within
// one unit of minibatch/world). kChunks: CNTK's decimation by randomized chunk (a rank parses
// only its own chunks; its share of a minibatch follows the chunks).
enum class Distribution { kBalanced = 0, kChunks = 1 };
const char* DistributionName(Distribution d);

// What a KaldiTable holds: matrices (a sample per row), vectors (one sample), or int32
// vectors (alignments: a sample per element).
enum class KaldiKind { kMatrix, kVector, kInt32Vector };

// One deserializer of a dataset.
struct DeserializerConfig {
  std::string type;  // canonical: "CNTKTextFormat", "CNTKBinary" or "KaldiTable"
  std::string file;  // absolute or relative to the working directory, already resolved
  // KaldiTable: the rspecifier as written (its file resolved later against base_dir, as are
  // relative paths inside scp files), what the table holds, whether `cmd |` may run.
  std::string rspecifier;
  KaldiKind kaldi_kind = KaldiKind::kMatrix;
  std::optional<bool> allow_pipes;
  std::string base_dir;  // the configuration file's directory
  bool skip_sequence_ids = false;
  uint64_t chunk_size_in_bytes = 32ull << 20;
  std::optional<uint64_t> max_errors;  // overrides the dataset's value when set
  std::optional<int> trace_level;
  std::vector<StreamConfig> streams;
};

struct DatasetConfig {
  std::string name;
  bool randomize = true;
  std::optional<uint64_t> randomization_window;  // unset: the CNTK default (see sampling/)
  bool sample_based_randomization_window = false;
  uint64_t randomization_seed = 0;
  bool frame_mode = false;
  bool truncated = false;
  uint64_t truncation_length = 0;
  uint64_t max_errors = 0;
  int trace_level = 1;
  bool keep_data_in_memory = false;
  bool cache_index = false;
  Precision precision = Precision::kFloat;
  std::optional<uint64_t> epoch_size;  // samples; unset: one sweep
  bool full_minibatches = false;       // minibatchMode: full (default partial)
  bool allow_pipes = false;            // Kaldi `cmd |` rxfilenames (a deserializer may override)
  // How ranks share minibatches: balanced in YAML/JSON configurations, chunks (CNTK's) in
  // BrainScript ones, unless `distribution` says.
  Distribution distribution = Distribution::kBalanced;
  std::vector<DeserializerConfig> deserializers;

  // Effective error budget and verbosity (a deserializer may override the dataset's).
  uint64_t EffectiveMaxErrors() const;
  int EffectiveTraceLevel() const;
  // All streams of all deserializers, in configuration order.
  std::vector<StreamConfig> AllStreams() const;
};

struct Config {
  std::string source;  // the file it was loaded from, for messages
  std::string listen;  // daemon address; empty: the daemon's default
  std::string tls_cert, tls_key;  // PEM files (resolved) for TLS on TCP; empty: plaintext
  std::string token_file;         // bearer token required on TCP; empty: none
  // TCP on an address other than loopback without a token is refused unless this is set
  // (`insecure: true`): anyone who reaches the port could read every dataset.
  bool insecure = false;
  struct Server {                 // daemon limits (`server:`); 0: the daemon's default
    int parser_threads = 0;             // parser pool shared by every subscription
    int parser_threads_per_stream = 0;  // chunks one subscription parses at once
    uint64_t max_subscriptions = 0;
    std::string assembler;              // "cpu" or "cuda"; empty: the daemon's default (cpu)
    int cuda_device = -1;               // -1: the daemon's default (0)
    // Memory, allocated once and reused (0: the daemon's defaults): the CUDA assembler's two
    // pinned staging buffers (and their device mirrors) per stream; the smallest slot of a
    // shared-memory or device segment, and a new segment's slots as a multiple of its batch.
    uint64_t staging_bytes = 0;
    uint64_t min_slot_bytes = 0;
    double slot_headroom = 0;
    // Permission bits of the unix socket (and its descriptor socket): 0600 by default (the
    // daemon's user only); 0660 lets a shared group's trainers in.
    int unix_socket_mode = -1;  // -1: the daemon's default (0600)
    // Memory budgets (0: the daemon's defaults): one subscription's batches in flight, every
    // subscription's together, parsed chunks of every dataset.
    uint64_t subscription_bytes = 0;
    uint64_t in_flight_bytes = 0;
    uint64_t chunk_cache_bytes = 0;
  } server;
  std::vector<DatasetConfig> datasets;
  std::vector<std::string> warnings;  // ignored keys and the like, for the caller to print

  // The dataset called `name`; nullptr if there is none.
  const DatasetConfig* Find(const std::string& name) const;
  // A human-readable list "a, b, c" of dataset names, for error messages.
  std::string DatasetNames() const;
};

}  // namespace conveyor
