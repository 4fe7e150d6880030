// index.h: what one pass over a data file learns: its sequences (key, byte range, first
// line, sample count) in file order, grouped into chunks of about chunkSizeInBytes that
// never split a sequence. Format-independent: every deserializer produces one, and the
// randomizer, packer and readers work from it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/index/sequence_table.h"

namespace conveyor {

struct ChunkEntry {
  uint64_t first_sequence = 0;  // index into Index::sequences
  uint64_t num_sequences = 0;
  uint64_t num_samples = 0;
  uint64_t begin_offset = 0;  // [begin_offset, end_offset) covers all its sequences
  uint64_t end_offset = 0;
};

// One input error found while indexing. 32 bytes; a cache-file record.
struct IndexError {
  enum Kind : uint64_t { kBlankRow = 0, kRepeatedId = 1 };
  uint64_t kind = kBlankRow;
  uint64_t line = 0;        // 0-based
  uint64_t first_line = 0;  // kRepeatedId: where the id was first used
  uint64_t key = 0;         // kRepeatedId: the id
};
static_assert(sizeof(IndexError) == 32, "IndexError is a cache-file record");

// Input errors found while indexing (blank rows, ids repeated on non-consecutive lines);
// the parser finds the rest. Sequences with a repeated id are left out of the index.
struct IndexErrors {
  uint64_t count = 0;
  std::vector<IndexError> first;  // the first few, in file order
  static constexpr size_t kMaxKept = 16;
};

struct Index {
  bool keys_are_line_numbers = false;  // no ids in the file (or skipSequenceIds)
  // Formats keyed by strings (Kaldi, HTK): sequence i is called names[i] (and its `key` is i).
  std::vector<std::string> names;
  // In file order. Owned when built; borrowed from the cache file's mapping when loaded from
  // an index cache (sequence_table.h: read it through a const reference).
  SequenceTable sequences;
  std::vector<ChunkEntry> chunks;
  uint64_t total_samples = 0;
  uint64_t file_size = 0;
  IndexErrors errors;
  // Hash64 of the sequence records (and names): the identity cursors carry
  // (ComputeContentHash(); an index cache stores it).
  uint64_t content_hash = 0;
  void ComputeContentHash();

  // Recomputes `chunks` and `total_samples` from `sequences`: a new chunk starts when the
  // current one is empty or adding the next sequence would pass `chunk_size` bytes.
  void BuildChunks(uint64_t chunk_size);
};

}  // namespace conveyor
