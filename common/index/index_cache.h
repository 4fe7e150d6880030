// index_cache.h: the on-disk index cache (cacheIndex: true). A cache file stores the
// sequence records of an Index with the data file's size and mtime and a hash of the
// configuration that shaped the index; it is used only when all three match and its
// checksum verifies. Chunks are not stored: they are rebuilt with the current chunk size.
//
// Layout (little-endian): "CVYIDX\0\1" magic, u32 version, u32 flags (bit 0: keys are line
// numbers), u64 data size, i64 data mtime (ns), u64 config hash, u64 sequence count,
// u64 error count, u32 kept errors, u32 zero, IndexError[kept], SequenceEntry[count],
// u64 checksum (Hash64 over the header and the errors, mixed with the records' Hash64).
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

// Writes atomically (temporary file + rename). Errors: the I/O failure (callers treat a
// failed write as a warning: the index is still good).
absl::Status WriteIndexCache(const std::string& cache_path, const Index& index,
                             const FileStamp& data_stamp, uint64_t config_hash);

// Reads a cache. Returns std::nullopt when there is no cache; FailedPrecondition when it is
// stale (other size, mtime or configuration); DataLoss when it is truncated or corrupt. The
// caller rebuilds in every non-ok case. `chunks` are left empty.
absl::StatusOr<std::optional<Index>> ReadIndexCache(const std::string& cache_path,
                                                    const FileStamp& data_stamp,
                                                    uint64_t config_hash);

}  // namespace conveyor
