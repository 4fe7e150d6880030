#include "common/index/index_cache.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"

namespace conveyor {
namespace {

constexpr char kMagic[8] = {'C', 'V', 'Y', 'I', 'D', 'X', '\0', '\1'};
constexpr uint32_t kVersion = 3;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  uint64_t data_size;
  int64_t data_mtime_ns;
  uint64_t config_hash;
  uint64_t num_sequences;
  uint64_t error_count;
  uint32_t kept_lines;
  uint32_t zero;
};
static_assert(sizeof(Header) == 64, "cache header layout");

}  // namespace

std::string IndexCachePath(const std::string& data_path, uint64_t config_hash) {
  return absl::StrFormat("%s.%08x.cvyidx", data_path, static_cast<uint32_t>(config_hash));
}

absl::Status WriteIndexCache(const std::string& cache_path, const Index& index,
                             const FileStamp& data_stamp, uint64_t config_hash) {
  Header h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.flags = index.keys_are_line_numbers ? 1u : 0u;
  h.data_size = data_stamp.size;
  h.data_mtime_ns = data_stamp.mtime_ns;
  h.config_hash = config_hash;
  h.num_sequences = index.sequences.size();
  h.error_count = index.errors.count;
  h.kept_lines = static_cast<uint32_t>(index.errors.first.size());

  const std::string tmp = absl::StrCat(cache_path, ".tmp.", ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot write the index cache: ", std::strerror(errno)));
  }
  // The checksum chains the header, the errors and the records' content hash, as
  // ReadIndexCache recomputes it.
  uint64_t sum = 0;
  bool ok = true;
  auto put = [&](const void* p, size_t n) {
    if (n == 0) return;
    sum = Hash64(p, n, sum);
    ok = ok && std::fwrite(p, 1, n, f) == n;
  };
  put(&h, sizeof(h));
  put(index.errors.first.data(), index.errors.first.size() * sizeof(IndexError));
  const size_t records = index.sequences.size() * sizeof(SequenceEntry);
  ok = ok && (records == 0 || std::fwrite(index.sequences.data(), 1, records, f) == records);
  sum = Mix64(sum, Hash64(index.sequences.data(), records));
  ok = ok && std::fwrite(&sum, 1, sizeof(sum), f) == sizeof(sum);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), cache_path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(cache_path, ": cannot write the index cache"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Index>> ReadIndexCache(const std::string& cache_path,
                                                    const FileStamp& data_stamp,
                                                    uint64_t config_hash) {
  FILE* f = std::fopen(cache_path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return std::optional<Index>();
    return absl::PermissionDeniedError(absl::StrCat(cache_path, ": cannot read the index cache: ", std::strerror(errno)));
  }
  auto corrupt = [&](const std::string& why) {
    std::fclose(f);
    return absl::DataLossError(absl::StrCat(cache_path, ": corrupt index cache: ", why));
  };
  std::fseek(f, 0, SEEK_END);
  const long file_size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  Header h;
  if (file_size < static_cast<long>(sizeof(Header) + sizeof(uint64_t)) || std::fread(&h, 1, sizeof(h), f) != sizeof(h)) {
    return corrupt("truncated header");
  }
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  if (h.version != kVersion) {
    std::fclose(f);
    return absl::FailedPreconditionError(
        absl::StrCat(cache_path, ": index cache version ", h.version, ", expected ", kVersion));
  }
  if (h.kept_lines > IndexErrors::kMaxKept) return corrupt("bad error-line count");
  const uint64_t size = static_cast<uint64_t>(file_size);
  if (h.num_sequences > size / sizeof(SequenceEntry)) return corrupt("sequence count exceeds the file size");
  const uint64_t expected = sizeof(Header) + h.kept_lines * sizeof(IndexError) +
                            h.num_sequences * sizeof(SequenceEntry) + sizeof(uint64_t);
  if (size != expected) return corrupt(absl::StrCat("size ", size, " bytes, expected ", expected));
  if (h.data_size != data_stamp.size || h.data_mtime_ns != data_stamp.mtime_ns) {
    std::fclose(f);
    return absl::FailedPreconditionError(absl::StrCat(cache_path, ": stale index cache (the data file changed)"));
  }
  if (h.config_hash != config_hash) {
    std::fclose(f);
    return absl::FailedPreconditionError(absl::StrCat(cache_path, ": index cache was built for another configuration"));
  }
  Index index;
  index.keys_are_line_numbers = (h.flags & 1u) != 0;
  index.file_size = h.data_size;
  index.errors.count = h.error_count;
  index.errors.first.resize(h.kept_lines);
  index.sequences.resize(h.num_sequences);
  uint64_t stored_sum = 0;
  const size_t errors_bytes = h.kept_lines * sizeof(IndexError);
  const size_t records_bytes = h.num_sequences * sizeof(SequenceEntry);
  if (std::fread(index.errors.first.data(), 1, errors_bytes, f) != errors_bytes ||
      std::fread(index.sequences.data(), 1, records_bytes, f) != records_bytes ||
      std::fread(&stored_sum, 1, sizeof(stored_sum), f) != sizeof(stored_sum)) {
    return corrupt("truncated");
  }
  std::fclose(f);
  f = nullptr;
  // The checksum chains the header, the errors and the records; the records' own hash is
  // the index's content hash, so it is computed once here.
  index.ComputeContentHash();
  uint64_t sum = Hash64(&h, sizeof(Header), 0);
  if (errors_bytes > 0) sum = Hash64(index.errors.first.data(), errors_bytes, sum);
  sum = Mix64(sum, index.content_hash);
  if (sum != stored_sum) {
    return absl::DataLossError(absl::StrCat(cache_path, ": corrupt index cache: checksum mismatch"));
  }
  // Records are checked against the data size: a cache must never send a reader out of bounds.
  uint64_t prev_end = 0;
  for (const SequenceEntry& s : index.sequences) {
    if (s.offset < prev_end || s.offset + s.size > h.data_size || s.size == 0) {
      return absl::DataLossError(absl::StrCat(cache_path, ": corrupt index cache: a sequence record lies outside the data file"));
    }
    prev_end = s.offset + s.size;
  }
  return std::optional<Index>(std::move(index));
}

}  // namespace conveyor
