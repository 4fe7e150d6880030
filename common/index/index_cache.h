// index_cache.h: the on-disk index cache (cacheIndex: true). A cache file stores the
// sequence records of an Index with the data file's size, mtime and sample hash (16 pieces
// of 4 KiB: MappedFile::SampleHash, so a file rewritten with its size and mtime kept is
// caught too) and a hash of the configuration that shaped the index; it is used only when all
// of them match and its checksums verify. Chunks are not stored: they are rebuilt with the current chunk size.
// A loaded index uses the records in place: they are borrowed from a read-only mapping of
// the cache file (SequenceTable), so opening costs no copy and no fresh memory, and the file
// is only ever replaced by a rename, never rewritten in place.
//
// Layout, version 5 (native byte order, little-endian on the machines we build for):
//   "CVYIDX\0\1" magic, u32 version (5), u32 flags (bit 0: keys are line numbers),
//   u64 data size, i64 data mtime (ns), u64 config hash, u64 sequence count, u64 error count,
//   u32 kept errors, u32 records per block (B), u64 content hash (Index::content_hash),
//   u64 data sample hash (FileStamp::sample_hash)              -- 80 bytes
//   IndexError[kept errors]                                    -- 32 bytes each
//   SequenceEntry[sequence count]                              -- 32 bytes each, 8-aligned
//   u64 block sum[ceil(count / B)]: a checksum of each block of B records and its number
//   u64 checksum: Hash64 over the header, the errors and the block sums
// Versions 3 (no block sums; the content hash recomputed at every load) and 4 (no sample
// hash) are refused as stale (FailedPrecondition) and the caller rebuilds, as for any stale cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/index/index.h"
#include "common/mapped_file.h"

namespace conveyor {

// The cache path for `data_path` and `config_hash`: "<data_path>.<hash8>.cvyidx".
std::string IndexCachePath(const std::string& data_path, uint64_t config_hash);

// Writes atomically (temporary file + rename). `index.content_hash` must be set
// (ComputeContentHash()): it is stored, and a loaded index carries it. Errors: the I/O failure
// (callers treat a failed write as a warning: the index is still good).
absl::Status WriteIndexCache(const std::string& cache_path, const Index& index,
                             const FileStamp& data_stamp, uint64_t config_hash);

// Reads a cache. Returns std::nullopt when there is no cache; FailedPrecondition when it is
// stale (other size, mtime, sample hash or configuration, or another format version); DataLoss when it is
// truncated or corrupt (a block of records failing its checksum, a record outside the data
// file or overlapping the previous one: the message names the record and its byte offset);
// PermissionDenied when it cannot be opened or mapped. The caller rebuilds in every non-ok
// case. Every record is checked before this returns, on up to `threads` threads (0: hardware
// concurrency). The returned index's `sequences` borrow the mapping (they keep it alive);
// `chunks` are left empty.
absl::StatusOr<std::optional<Index>> ReadIndexCache(const std::string& cache_path,
                                                    const FileStamp& data_stamp,
                                                    uint64_t config_hash, int threads = 0);

}  // namespace conveyor
