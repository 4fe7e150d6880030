// cbf_reader.h: CNTK Binary Format, the layout CNTK's ctf2bin.py writes and CNTK's
// CNTKBinaryReader reads (every real CBF file; ../shared/testdata/cntk/README.md section 7).
// Little endian:
//   file:   u64 magic "cntk_bin", u32 version (1), chunks..., header, i64 header offset
//   header: u64 magic, u32 numChunks, u32 numStreams,
//           per stream: u8 matrixType (0 dense, 1 sparse CSC), u32 nameLen, name,
//                       u8 elemType (0 float, 1 double), u32 dim
//           per chunk:  i64 offset, u32 numSequences, u32 numSamples
//   chunk:  u32 seqLen[numSequences] (samples, the most of any stream), then per stream,
//           per sequence: dense  u32 n, elem[n * dim]
//                         sparse u32 n, i32 nnz, elem[nnz], i32 index[nnz], i32 nnzPerSample[n]
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
#include "common/batch/parsed_chunk.h"
#include "common/config/dataset_config.h"
#include "common/index/index.h"

namespace conveyor {

inline constexpr uint64_t kCbfMagic = 0x636e746b5f62696eull;  // "cntk_bin" read as a little-endian u64

struct CbfStreamInfo {
  std::string name;
  StreamFormat format = StreamFormat::kDense;  // dense or sparse
  Precision precision = Precision::kFloat;
  uint32_t dim = 0;
};

struct CbfChunkInfo {
  uint64_t offset = 0, end = 0;  // bytes [offset, end) of the file
  uint32_t num_sequences = 0, num_samples = 0;
};

struct CbfFile {
  std::vector<CbfStreamInfo> streams;
  std::vector<CbfChunkInfo> chunks;
  uint64_t header_offset = 0;
};

// True when `bytes` starts with the CBF magic.
bool IsCbf(std::string_view bytes);

// Reads and checks the header and chunk table. Errors: InvalidArgument naming `path` and
// the byte offset (bad magic or version, counts or offsets outside the file).
absl::StatusOr<CbfFile> ReadCbfFile(std::string_view bytes, const std::string& path);

// One SequenceEntry per sequence (key: global index; offset: its chunk's; num_samples: its
// seqLen) and one ChunkEntry per file chunk. Errors: DataLoss for a chunk whose sequence
// lengths lie outside it or disagree with the chunk table.
absl::StatusOr<Index> BuildCbfIndex(const CbfFile& file, std::string_view bytes, const std::string& path);

// Decodes chunk `chunk_id`. `source[i]` is the file stream delivered as output stream i (the
// others are skipped); every file stream must have `precision`. Errors: DataLoss
// "PATH: chunk C, byte B: ..." for anything inconsistent or out of bounds.
absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseCbfChunk(std::string_view bytes, const CbfFile& file,
                                                           const Index& index, uint64_t chunk_id,
                                                           const std::vector<int>& source, Precision precision,
                                                           const std::string& path);

}  // namespace conveyor
