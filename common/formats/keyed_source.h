// keyed_source.h: a deserializer whose sequences are addressed one by one and named by string
// keys (Kaldi tables, HTK features, MLF labels). The dataset joins one or several of them by
// key (composite datasets), chunks the joined sequences and asks each source to decode its
// part of a sequence into the chunk's columns. Opening a source scans it completely (every
// length checked), so that Decode cannot meet malformed input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/batch/parsed_chunk.h"
#include "common/config/dataset_config.h"

namespace conveyor {

class KeyedSource {
 public:
  virtual ~KeyedSource() = default;
  // Its streams, formats and dims resolved (a dim left to the data is known once open).
  virtual const std::vector<StreamConfig>& streams() const = 0;
  virtual size_t size() const = 0;
  virtual const std::string& key(size_t i) const = 0;
  // Samples of sequence i in stream k of this source.
  virtual uint32_t samples(size_t i, size_t k) const = 0;
  // Bytes of input sequence i occupies (chunking and throughput accounting).
  virtual uint64_t bytes(size_t i) const = 0;
  // Appends sequence i to out[k] for every stream k of this source, values in `precision`.
  virtual absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const = 0;
  // For a source of one dense stream: where sequence i's values lie in its input, already
  // in `precision`, row-major and contiguous, so that they can be used without decoding
  // (ParsedStream::in_place); null when they must be decoded.
  virtual const std::byte* InPlace(size_t, Precision) const { return nullptr; }
  // Entry `i`'s dense values as a compressed matrix the assembler can decode (Kaldi CM, CM2,
  // CM3); false when it is stored otherwise.
  virtual bool Compressed(size_t, CompressedDense*) const { return false; }
  // Bytes a parsed sequence holds per input byte, when far above 1 (an HTK context window
  // repeats every frame window-fold): chunks are cut smaller by as much, so that a chunk's
  // parsed size, not its input, stays near chunkSizeInBytes.
  virtual uint64_t expansion() const { return 1; }
  virtual void WillNeed(size_t) const {}
  // Sources that decode whole units (a CTF/CBF member parses a chunk at a time): the unit
  // entry i lies in, so that a join can tell how often its order makes a source re-parse;
  // -1 for sources that decode entries one by one (Kaldi, HTK, MLF).
  virtual int64_t ParseUnit(size_t) const { return -1; }
  // The bytes of every input it reads (files, pipe outputs), for benchmarks' references.
  virtual std::vector<std::string_view> inputs() const = 0;
  // The files behind inputs(), in the same order; "" for an input that is no file (a pipe).
  virtual std::vector<std::string> input_paths() const = 0;
  // What it reads, for messages ("scp:data/feats.scp").
  virtual std::string description() const = 0;
  // Entries dropped while opening (unreadable entries within maxErrors or Kaldi's `p`).
  virtual uint64_t skipped() const { return 0; }
};

}  // namespace conveyor
