// cbf_reader.h: CNTK Binary Format in its two layouts, told apart by the first 8 bytes.
//
// 1. The layout CNTK's ctf2bin.py writes and CNTK's CNTKBinaryReader reads (every real CBF
// file; Scripts/ctf2bin.py and Source/Readers/CNTKBinaryReader/ in CNTK's repository),
// starting with the magic "cntk_bin".
// Little endian:
//   file:   u64 magic "cntk_bin", u32 version (1), chunks..., header, i64 header offset
//   header: u64 magic, u32 numChunks, u32 numStreams,
//           per stream: u8 matrixType (0 dense, 1 sparse CSC), u32 nameLen, name,
//                       u8 elemType (0 float, 1 double), u32 dim
//           per chunk:  i64 offset, u32 numSequences, u32 numSamples
//   chunk:  u32 seqLen[numSequences] (samples, the most of any stream), then per stream,
//           per sequence: dense  u32 n, elem[n * dim]
//                         sparse u32 n, i32 nnz, elem[nnz], i32 index[nnz], i32 nnzPerSample[n]
//
// 2. The layout CNTK's documentation describes ("BrainScript CNTK Binary Reader"),
// starting with its version (i64 1). Little endian:
//   header: i64 version (1), i64 numChunks, i32 numInputs,
//           per input: i32 len, name[len], i32 deserializer (0 dense, 1 sparse), then
//                      dense:  i32 elemType (0 float, 1 double), i32 sampleSize
//                      sparse: i32 storageType (0 CSC), i32 elemType, i32 isSequence, i32 sampleSize
//   offsets table: per chunk i64 offset (from the start of the data section, which follows
//           the table), i32 numSequences, i32 numSamples
//   chunk:  per input, in header order:
//           dense:  elem[numSequences * sampleSize] (one sample a sequence)
//           sparse: i32 nnz, elem[nnz], i32 row[nnz], i32 colStart[numSequences + 1], where
//                   row = sample * sampleSize + index (the sample within its sequence)
//   A sparse input's sequence has (last sample number + 1) samples (1 when isSequence is 0;
//   none when a sequence input has no entry); a sequence's length is the longest of its
//   inputs, and a chunk's lengths must add up to its numSamples.
//
// Every count, length and offset is checked against the file before use: a corrupt or
// truncated file is an error naming the file, chunk and byte offset. Sequence keys are
// global sequence indices. The file's chunks are conveyor's chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chunk/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/index/index.h"

namespace conveyor {

inline constexpr uint64_t kCbfMagic = 0x636e746b5f62696eull;  // "cntk_bin" read as a little-endian u64
inline constexpr uint64_t kCbfDocumentedVersion = 1;            // the documented layout's first i64

enum class CbfLayout {
  kCntk,        // magic "cntk_bin": what ctf2bin writes and CNTK reads
  kDocumented,  // version first: the documentation's header / offsets table / data
};

struct CbfStreamInfo {
  std::string name;
  StreamFormat format = StreamFormat::kDense;  // dense or sparse
  Precision precision = Precision::kFloat;
  uint32_t dim = 0;
  bool is_sequence = true;  // kDocumented sparse inputs: their isSequence flag
};

struct CbfChunkInfo {
  uint64_t offset = 0, end = 0;  // bytes [offset, end) of the file
  uint32_t num_sequences = 0, num_samples = 0;
};

struct CbfFile {
  CbfLayout layout = CbfLayout::kCntk;
  std::vector<CbfStreamInfo> streams;
  std::vector<CbfChunkInfo> chunks;
  uint64_t header_offset = 0;  // kCntk: where the header is; kDocumented: where the data section starts
};

// True when `bytes` starts like a CBF file of either layout: the magic, or version 1 as an i64.
bool IsCbf(std::string_view bytes);

// Reads and checks the header and chunk table of either layout. Errors: InvalidArgument
// naming `path` and the byte offset (bad magic or version, counts or offsets outside the file).
absl::StatusOr<CbfFile> ReadCbfFile(std::string_view bytes, const std::string& path);

// One SequenceEntry per sequence (key: global index; offset: its chunk's; num_samples: its
// length) and one ChunkEntry per file chunk. kDocumented files store no lengths: every
// chunk is walked (its sparse entries give the sample counts) and checked whole here, so
// that parsing it later can only fail on what changed since. Errors: DataLoss for a chunk
// whose contents lie outside it or disagree with the chunk table.
absl::StatusOr<Index> BuildCbfIndex(const CbfFile& file, std::string_view bytes, const std::string& path);

// Decodes chunk `chunk_id`. `source[i]` is the file stream delivered as output stream i (the
// others are skipped); every file stream must have `precision`. Errors: DataLoss
// "PATH: chunk C, byte B: ..." for anything inconsistent or out of bounds.
absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path);
// The same from `bytes`, the file's bytes from offset `base` on (at least the chunk's,
// [offset, end) of file.chunks[chunk_id], as read): the same result and error texts (byte
// offsets in the file). The result's values used in place point into `bytes`, which must
// outlive it (a reader hands it the bytes: ParsedChunk::file_bytes).
absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, uint64_t base, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path);

// What a composite member needs of a chunk (chunked_file.h), without decoding it.
struct CbfChunkCounts {
  HugeVector<int32_t> slot_of;    // per sequence of the chunk: its slot in ParseCbfChunk's result, or -1
  std::vector<uint32_t> samples;  // per delivered slot, per delivered stream (slot-major)
};

// Chunk `chunk_id`'s sequences as ParseCbfChunk would deliver them (`source` as there): the
// same slots and per-stream sample counts, no value decoded. Checked exactly as ParseCbfChunk
// checks the chunk, so it fails where and as that would. kCntk: a walk over each sequence's
// u32 n per stream that skips the values (a sparse sequence's indices and per-sample counts
// are still read, to check them); kDocumented: the walk the index made (dense inputs one
// sample a sequence, sparse ones from colStart/rows), which is all the decoder checks.
// Errors: as ParseCbfChunk.
absl::Status CountCbfChunk(std::string_view bytes, const CbfFile& file, const Index& index,
                           uint64_t chunk_id, const std::vector<int>& source, Precision precision,
                           const std::string& path, CbfChunkCounts* out);

}  // namespace conveyor
