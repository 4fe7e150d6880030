// index.h: what one pass over a data file learns: its sequences (key, byte range, first
// line, sample count) in file order, grouped into chunks of about chunkSizeInBytes that
// never split a sequence. Format-independent: every deserializer produces one, and the
// randomizer, packer and readers work from it alone.
#pragma once

#include <cstdint>
#include <string>
#include <string>
#include <vector>

namespace conveyor {

// One sequence. 32 bytes; trivially copyable (the cache file stores these records).
struct SequenceEntry {
  uint64_t key = 0;          // the numeric id as written, or the 0-based line number
  uint64_t offset = 0;       // byte offset of the sequence's first line in the file
  uint64_t line = 0;         // 0-based line number of that first line
  uint32_t size = 0;         // bytes, from `offset` to the end of its last line (newline included)
  uint32_t num_samples = 0;  // rows (or rows carrying the definesMBSize stream)
};
static_assert(sizeof(SequenceEntry) == 32, "SequenceEntry is a cache-file record");

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
  std::vector<SequenceEntry> sequences;
  std::vector<ChunkEntry> chunks;
  uint64_t total_samples = 0;
  uint64_t file_size = 0;
  IndexErrors errors;
  // Hash64 of the sequence records: the identity cursors carry (ComputeContentHash()).
  uint64_t content_hash = 0;
  void ComputeContentHash();

  // Recomputes `chunks` and `total_samples` from `sequences`: a new chunk starts when the
  // current one is empty or adding the next sequence would pass `chunk_size` bytes.
  void BuildChunks(uint64_t chunk_size);
};

}  // namespace conveyor
