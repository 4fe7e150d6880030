#include "common/index/index_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

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

// Reads exactly `n` bytes (retrying short reads); false on an error or end of file.
bool ReadFully(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Hash64 over a byte stream given in pieces whose sizes are multiples of 8: the same value
// as one Hash64 call (default seed) over the whole, so the content hash of a loaded index is
// the one Index::ComputeContentHash gives.
class ContentHasher {
 public:
  void Add(const void* data, size_t size) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i + 8 <= size; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h_ = Mix64(h_, w);
    }
    size_ += size;
  }
  uint64_t Finish() const { return Mix64(Mix64(h_, 0), size_); }

 private:
  uint64_t h_ = 0x9e3779b97f4a7c15ull;
  uint64_t size_ = 0;
};
static_assert(sizeof(SequenceEntry) % 8 == 0, "records hash in whole words");

// Reserves room for `n` records without touching it; the caller grows the vector block by
// block, so each block is zeroed and overwritten while in the CPU's cache. (Asking for huge
// pages here, with MADV_HUGEPAGE and MADV_POPULATE_WRITE, halved a warm 10^8-record open but
// cost 9-11 s of kernel compaction when memory was fragmented, as after the indexing run that
// wrote the cache: see bench/RESULTS.md, issue 19.)
void ReserveRecords(std::vector<SequenceEntry>* v, uint64_t n) { v->reserve(n); }

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
  const int fd = ::open(cache_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<Index>();
    return absl::PermissionDeniedError(absl::StrCat(cache_path, ": cannot read the index cache: ", std::strerror(errno)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(cache_path, ": corrupt index cache: ", why));
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) return corrupt(std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Header h;
  if (size < sizeof(Header) + sizeof(uint64_t) || !ReadFully(fd, &h, sizeof(h))) {
    return corrupt("truncated header");
  }
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  if (h.version != kVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(cache_path, ": index cache version ", h.version, ", expected ", kVersion));
  }
  if (h.kept_lines > IndexErrors::kMaxKept) return corrupt("bad error-line count");
  if (h.num_sequences > size / sizeof(SequenceEntry)) return corrupt("sequence count exceeds the file size");
  const uint64_t expected = sizeof(Header) + h.kept_lines * sizeof(IndexError) +
                            h.num_sequences * sizeof(SequenceEntry) + sizeof(uint64_t);
  if (size != expected) return corrupt(absl::StrCat("size ", size, " bytes, expected ", expected));
  if (h.data_size != data_stamp.size || h.data_mtime_ns != data_stamp.mtime_ns) {
    return absl::FailedPreconditionError(absl::StrCat(cache_path, ": stale index cache (the data file changed)"));
  }
  if (h.config_hash != config_hash) {
    return absl::FailedPreconditionError(absl::StrCat(cache_path, ": index cache was built for another configuration"));
  }
  Index index;
  index.keys_are_line_numbers = (h.flags & 1u) != 0;
  index.file_size = h.data_size;
  index.errors.count = h.error_count;
  index.errors.first.resize(h.kept_lines);
  const size_t errors_bytes = h.kept_lines * sizeof(IndexError);
  if (!ReadFully(fd, index.errors.first.data(), errors_bytes)) return corrupt("truncated");
  ReserveRecords(&index.sequences, h.num_sequences);
  // One pass, a block at a time: read the records, hash them (the index's content hash,
  // the same value as Index::ComputeContentHash) and check them against the data size
  // while the block is in the CPU's cache.
  ContentHasher hasher;
  uint64_t prev_end = 0;
  bool outside = false;
  constexpr size_t kBlockRecords = (4u << 20) / sizeof(SequenceEntry);
  for (uint64_t first = 0; first < h.num_sequences; first += kBlockRecords) {
    const uint64_t n = std::min<uint64_t>(kBlockRecords, h.num_sequences - first);
    index.sequences.resize(first + n);
    SequenceEntry* block = index.sequences.data() + first;
    if (!ReadFully(fd, block, n * sizeof(SequenceEntry))) return corrupt("truncated");
    hasher.Add(block, n * sizeof(SequenceEntry));
    for (uint64_t i = 0; i < n; ++i) {
      const SequenceEntry& s = block[i];
      outside |= s.offset < prev_end || s.offset + s.size > h.data_size || s.size == 0;
      prev_end = s.offset + s.size;
    }
  }
  uint64_t stored_sum = 0;
  if (!ReadFully(fd, &stored_sum, sizeof(stored_sum))) return corrupt("truncated");
  index.content_hash = hasher.Finish();
  // The checksum chains the header, the errors and the records' content hash.
  uint64_t sum = Hash64(&h, sizeof(Header), 0);
  if (errors_bytes > 0) sum = Hash64(index.errors.first.data(), errors_bytes, sum);
  sum = Mix64(sum, index.content_hash);
  if (sum != stored_sum) return corrupt("checksum mismatch");
  // Records are checked against the data size: a cache must never send a reader out of bounds.
  if (outside) return corrupt("a sequence record lies outside the data file");
  return std::optional<Index>(std::move(index));
}

}  // namespace conveyor
