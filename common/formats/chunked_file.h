// chunked_file.h: the part shared by deserializers of one mapped file that they cut into
// chunks themselves (CNTKTextFormat, CNTKBinary): the file, the index, reading a chunk, and
// their sequences by key for a composite.
//
// The file is mapped (indexing and listing read it through the mapping, then drop its pages
// from it), but a chunk to parse is read into memory of its own (ReadChunk: pread(2) into
// 2 MiB blocks kept for reuse) rather than read through the mapping: the mapping would make
// and drop a page-table entry per 4 KiB page on every read of the chunk, which on the
// virtual machines measured costs 3-4x the copy (bench/RESULTS.md, "Chunks read, not
// mapped"), and the process's resident memory stays the parsed window's.
//
// As a member of a composite (DeserializerContext::member), its sequences are joined by key
// with the other deserializers' (the first deserializer's order) and served sequence by
// sequence. Its keys are its sequence ids as decimal text (CTF: the id written at the start
// of each line, or the line number without ids; CBF: the sequence's index in the file),
// which is what a Kaldi or HTK key of the same sequence must read. Opening it as a member
// learns each sequence's sample count per stream, which joining and chunking need, chunk by
// chunk on all cores (ListChunk), exactly as parsing the chunk would give them: the same
// sequences (one the parser drops, as bad within maxErrors or as empty in every configured
// stream, is not offered), the same counts, and a chunk that cannot be parsed fails the open
// with the parser's error.
// - CBF reads the counts its file states, no value decoded (cbf_reader.h, CountCbfChunk):
//   ctf2bin's layout stores a u32 sample count before each sequence's values in every
//   stream, so a walk over the counts skips the values; the documented layout's dense inputs
//   have one sample a sequence and its sparse inputs' counts come from the colStart/rows walk
//   the index already made. Both walks check everything the decoder checks, with the
//   decoder's own code and messages. A CBF parse drops no sequence as bad (a damaged chunk
//   fails whole), and the empty ones are told apart by the counts alone.
// - CTF parses every chunk (then drops it): its index knows each sequence's lines, not its
//   samples per stream (a line holds samples of any subset of the streams, told only by
//   reading its fields), and the sequences it drops as bad within maxErrors are found only
//   by parsing their values, so no route short of reading the text is exact.
// Decode then copies a sequence out of its parsed chunk; the last few parsed chunks are
// kept, so reading in the file's own order (the file as the primary deserializer, or joined
// in the same order) parses every chunk once (a CTF member: once more). A member keeps
// diagnostics and an error budget of its own (its errors count when read).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/chunk/chunk_cache.h"
#include "common/formats/deserializer.h"
#include "common/huge_pages.h"
#include "common/mapped_file.h"

namespace conveyor {

class ChunkedFileDeserializer : public Deserializer {
 public:
  const std::vector<StreamConfig>& streams() const override { return streams_; }
  const Index* chunks() const override { return &index_; }
  IndexSource index_source() const override { return index_source_; }
  const std::string& index_cache_path() const override { return cache_path_; }

  size_t size() const override { return entries_.size(); }
  const std::string& key(size_t i) const override { return keys_[i]; }
  uint32_t samples(size_t i, size_t k) const override { return samples_[i * streams_.size() + k]; }
  uint64_t bytes(size_t i) const override { return entries_[i].bytes; }
  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override;
  int64_t ParseUnit(size_t i) const override { return entries_[i].chunk; }

  std::vector<std::string_view> inputs() const override { return {file_->bytes()}; }
  std::vector<std::string> input_paths() const override { return {file_->path()}; }
  std::string description() const override { return path_; }
  uint64_t skipped() const override { return skipped_; }
  // Chunks this member parsed itself, at open and when read (0 for one that is no member:
  // its dataset parses its chunks). Thread-safe.
  uint64_t chunks_parsed() const { return chunks_parsed_.load(); }

 protected:
  // Takes the context's diagnostics and budget, or, for a member, makes its own.
  explicit ChunkedFileDeserializer(const DeserializerContext& context);
  // Maps the configured file (path_, file_), kept open for ReadChunk. Errors: those of
  // MappedFile::Open.
  absl::Status MapFile(const DeserializerContext& context);
  // Chunk `chunk_id`'s bytes, [begin_offset, end_offset) of the file, read (not mapped).
  // Errors: OutOfRange (no such chunk), those of MappedFile::Read (DataLoss where the file
  // is now shorter).
  absl::StatusOr<HugeBytes> ReadChunk(uint64_t chunk_id) const;
  // Drops the pages of the file's bytes [offset, offset+length) read through the mapping
  // (indexing, listing) from it: the page cache keeps them.
  void DropPages(uint64_t offset, uint64_t length) const { file_->DontNeed(offset, length); }
  // For a member: every chunk listed once (ListChunk), its sequences by key (see above).
  absl::Status FinishOpen(const DeserializerContext& context);

  // One chunk's sequences as a member lists them at open: per sequence of the chunk in file
  // order, its slot in ParseChunk's result (-1: not delivered); per slot, its key and its
  // samples per stream (slot-major).
  struct ChunkSequences {
    HugeVector<int32_t> slot_of;  // (as ParsedChunk's: moved from there)
    HugeVector<uint64_t> keys;
    std::vector<uint32_t> samples;
  };
  // Exactly what ParseChunk(c) would deliver, or its error. This one parses the chunk; a
  // format that can tell without parsing overrides it (see above). Called from several
  // threads at once.
  virtual absl::Status ListChunk(uint64_t c, ChunkSequences* out) const;

  std::unique_ptr<Diagnostics> own_diagnostics_;
  std::unique_ptr<ErrorBudget> own_budget_;
  Diagnostics* diagnostics_ = nullptr;
  ErrorBudget* budget_ = nullptr;
  std::vector<StreamConfig> streams_;
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  Index index_;
  IndexSource index_source_ = IndexSource::kBuilt;
  std::string cache_path_;

 private:
  struct Entry {
    uint32_t chunk = 0;  // the file's own chunk
    uint32_t slot = 0;   // the sequence's parsed slot in it
    uint64_t bytes = 0;
  };
  absl::Status Scan(const DeserializerContext& context);
  // ParseChunk(c), counted.
  absl::StatusOr<std::unique_ptr<ParsedChunk>> CountedParse(uint64_t c) const;
  // A parsed chunk, from the few kept (most recent last) or parsed again.
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> Chunk(uint32_t c) const;

  static constexpr size_t kKept = 4;
  std::vector<Entry> entries_;
  std::vector<std::string> keys_;
  std::vector<uint32_t> samples_;  // entries x streams
  uint64_t skipped_ = 0;
  std::unique_ptr<ChunkCache> cache_;  // members only
  mutable std::atomic<uint64_t> chunks_parsed_{0};
  mutable std::mutex mu_;
  mutable std::deque<std::pair<uint32_t, std::shared_ptr<const ParsedChunk>>> recent_;
};

}  // namespace conveyor
