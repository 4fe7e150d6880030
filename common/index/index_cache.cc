#include "common/index/index_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"

namespace conveyor {
namespace {

constexpr char kMagic[8] = {'C', 'V', 'Y', 'I', 'D', 'X', '\0', '\1'};
constexpr uint32_t kVersion = 5;
// Records per checksummed block: 1 MiB, small enough to check while in the CPU's cache and
// to share among threads, large enough that the block sums are a small table (24 KB at 10^8).
constexpr uint32_t kBlockRecords = 32768;
// A reader accepts other block sizes up to this (a later writer may choose another).
constexpr uint32_t kMaxBlockRecords = 1u << 24;

// Versions 3 and 4 had the same first 56 bytes (magic and version at the same place), so an
// old cache is told apart by its version and refused as stale. Version 5 keeps the data
// file's sample hash where version 4 had a zero.
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
  uint32_t block_records;
  uint64_t content_hash;
  uint64_t data_sample_hash;
};
static_assert(sizeof(Header) == 80, "cache header layout");
static_assert(sizeof(Header) % alignof(SequenceEntry) == 0 &&
                  sizeof(IndexError) % alignof(SequenceEntry) == 0,
              "records stay aligned in the mapping");

// The checksum of one block of records: eight Mix64 chains over interleaved words, then
// combined. The serial Hash64 chain (one multiply-mix waiting on the last) runs at ~5 GB/s;
// eight independent chains keep the multiplier busy (~19 GB/s here). Seeded with the block's
// number, so that blocks swapped or repeated fail too.
uint64_t BlockSum(const SequenceEntry* records, size_t n, uint64_t block) {
  static_assert(sizeof(SequenceEntry) % 8 == 0, "records sum in whole words");
  const unsigned char* p = reinterpret_cast<const unsigned char*>(records);
  const size_t words = n * sizeof(SequenceEntry) / 8;
  constexpr int kLanes = 8;
  uint64_t h[kLanes];
  for (int l = 0; l < kLanes; ++l)
    h[l] = Mix64(0x9e3779b97f4a7c15ull + static_cast<uint64_t>(l), block);
  size_t i = 0;
  for (; i + kLanes <= words; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      uint64_t w;
      std::memcpy(&w, p + 8 * (i + static_cast<size_t>(l)), 8);
      h[l] = Mix64(h[l], w);
    }
  }
  uint64_t sum = Mix64(block, words);
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    sum = Mix64(sum, w);
  }
  for (int l = 0; l < kLanes; ++l) sum = Mix64(sum, h[l]);
  return sum;
}

// The checksum over everything but the records: the header, the kept errors, the block sums.
uint64_t FrameSum(const Header& h, const IndexError* errors, const uint64_t* block_sums,
                  uint64_t blocks) {
  uint64_t sum = Hash64(&h, sizeof(Header), 0);
  if (h.kept_lines > 0) sum = Hash64(errors, h.kept_lines * sizeof(IndexError), sum);
  if (blocks > 0) sum = Hash64(block_sums, blocks * sizeof(uint64_t), sum);
  return sum;
}

// The first problem found in the records, by record number (blocks are checked out of order
// by several threads; the earliest is reported, as one thread would).
struct RecordProblem {
  uint64_t record = UINT64_MAX;
  std::string what;
};

// What ReadIndexCache checks in the records, block by block.
struct RecordCheck {
  const MappedFile* file;
  const SequenceEntry* records;
  uint64_t records_offset;  // of records[0] in the file
  uint64_t num_records;
  uint32_t block_records;
  const uint64_t* block_sums;
  uint64_t data_size;

  // Checks blocks [first, last): maps each in (one call instead of a page fault every few
  // pages), compares its sum, then checks its records while they are in the CPU's cache:
  // each inside the data file, not empty, after the previous one's end. Stops at the first
  // problem.
  RecordProblem Run(uint64_t first, uint64_t last) const {
    for (uint64_t b = first; b < last; ++b) {
      const uint64_t begin = b * block_records;
      const uint64_t n = std::min<uint64_t>(block_records, num_records - begin);
      const uint64_t at = records_offset + begin * sizeof(SequenceEntry);
      file->WillNeed(at, n * sizeof(SequenceEntry), /*populate=*/true);
      if (BlockSum(records + begin, n, b) != block_sums[b]) {
        return {begin, absl::StrCat("records ", begin, "-", begin + n - 1, " (bytes ", at, "-",
                                    at + n * sizeof(SequenceEntry), ") fail their checksum")};
      }
      uint64_t prev_end = begin == 0 ? 0 : records[begin - 1].offset + records[begin - 1].size;
      for (uint64_t i = begin; i < begin + n; ++i) {
        const SequenceEntry& s = records[i];
        // Written so that no sum can wrap: offset <= data_size first.
        if (s.offset < prev_end || s.offset > data_size || s.size > data_size - s.offset ||
            s.size == 0) {
          return {i,
                  absl::StrCat("sequence record ", i, " (byte ",
                               records_offset + i * sizeof(SequenceEntry),
                               ") lies outside the data file or overlaps the previous one: offset ",
                               s.offset, ", size ", s.size, ", data file ", data_size, " bytes")};
        }
        prev_end = s.offset + s.size;
      }
    }
    return {};
  }
};

// Runs `check` over all blocks on up to `threads` threads (0: hardware concurrency), a
// contiguous range of blocks each; returns the earliest problem.
RecordProblem CheckRecords(const RecordCheck& check, uint64_t blocks, int threads) {
  uint64_t t = threads > 0 ? static_cast<uint64_t>(threads)
                           : std::max(1u, std::thread::hardware_concurrency());
  // At least 16 blocks (16 MiB) a thread: below that a thread costs more than it saves.
  t = std::max<uint64_t>(1, std::min<uint64_t>({t, blocks / 16, 16}));
  std::vector<RecordProblem> found(t);
  std::vector<std::thread> pool;
  for (uint64_t k = 1; k < t; ++k) {
    pool.emplace_back([&, k] { found[k] = check.Run(blocks * k / t, blocks * (k + 1) / t); });
  }
  found[0] = check.Run(0, blocks / t);
  for (std::thread& th : pool) th.join();
  RecordProblem first;
  for (RecordProblem& p : found) {
    if (p.record < first.record) first = std::move(p);
  }
  return first;
}

}  // namespace

std::string IndexCachePath(const std::string& data_path, uint64_t config_hash) {
  return absl::StrFormat("%s.%08x.cvyidx", data_path, static_cast<uint32_t>(config_hash));
}

absl::Status WriteIndexCache(const std::string& cache_path, const Index& index,
                             const FileStamp& data_stamp, uint64_t config_hash) {
  const SequenceTable& records = index.sequences;
  Header h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.flags = index.keys_are_line_numbers ? 1u : 0u;
  h.data_size = data_stamp.size;
  h.data_mtime_ns = data_stamp.mtime_ns;
  h.data_sample_hash = data_stamp.sample_hash;
  h.config_hash = config_hash;
  h.num_sequences = records.size();
  h.error_count = index.errors.count;
  h.kept_lines = static_cast<uint32_t>(index.errors.first.size());
  h.block_records = kBlockRecords;
  h.content_hash = index.content_hash;

  // A new file renamed over the old one, never a rewrite in place: a process that has the old
  // cache mapped (its index uses the records in place) keeps the old file's pages.
  const std::string tmp = absl::StrCat(cache_path, ".tmp.", ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot write the index cache: ", std::strerror(errno)));
  }
  bool ok = true;
  auto put = [&](const void* p, size_t n) { ok = ok && (n == 0 || std::fwrite(p, 1, n, f) == n); };
  put(&h, sizeof(h));
  put(index.errors.first.data(), index.errors.first.size() * sizeof(IndexError));
  const uint64_t blocks = (records.size() + kBlockRecords - 1) / kBlockRecords;
  std::vector<uint64_t> block_sums(blocks);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = b * kBlockRecords;
    const uint64_t n = std::min<uint64_t>(kBlockRecords, records.size() - begin);
    block_sums[b] = BlockSum(records.data() + begin, n, b);
    put(records.data() + begin, n * sizeof(SequenceEntry));
  }
  put(block_sums.data(), blocks * sizeof(uint64_t));
  const uint64_t sum = FrameSum(h, index.errors.first.data(), block_sums.data(), blocks);
  put(&sum, sizeof(sum));
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), cache_path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(cache_path, ": cannot write the index cache"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Index>> ReadIndexCache(const std::string& cache_path,
                                                    const FileStamp& data_stamp,
                                                    uint64_t config_hash, int threads) {
  auto mapped = MappedFile::Open(cache_path);
  if (!mapped.ok()) {
    if (absl::IsNotFound(mapped.status())) return std::optional<Index>();
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the index cache: ", mapped.status().message()));
  }
  // Shared: the loaded index's records borrow this mapping and keep it alive.
  std::shared_ptr<const MappedFile> file = std::move(*mapped);
  const std::string_view bytes = file->bytes();
  const uint64_t size = bytes.size();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(cache_path, ": corrupt index cache: ", why));
  };
  Header h;
  constexpr size_t kVersionEnd = offsetof(Header, version) + sizeof(uint32_t);
  if (size < kVersionEnd) return corrupt("truncated header");
  std::memcpy(&h, bytes.data(), kVersionEnd);
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  if (h.version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        cache_path, ": index cache format version ", h.version,
        h.version < kVersion ? " (written by an older conveyor)" : " (written by a newer conveyor)",
        ", this build reads version ", kVersion));
  }
  if (size < sizeof(Header) + sizeof(uint64_t)) return corrupt("truncated header");
  std::memcpy(&h, bytes.data(), sizeof(Header));
  if (h.kept_lines > IndexErrors::kMaxKept) return corrupt("bad error-line count");
  if (h.block_records == 0 || h.block_records > kMaxBlockRecords) {
    return corrupt(absl::StrCat("bad block size ", h.block_records));
  }
  if (h.num_sequences > size / sizeof(SequenceEntry))
    return corrupt("sequence count exceeds the file size");
  const uint64_t blocks = (h.num_sequences + h.block_records - 1) / h.block_records;
  const uint64_t records_offset = sizeof(Header) + h.kept_lines * sizeof(IndexError);
  const uint64_t sums_offset = records_offset + h.num_sequences * sizeof(SequenceEntry);
  const uint64_t expected = sums_offset + blocks * sizeof(uint64_t) + sizeof(uint64_t);
  if (size != expected) return corrupt(absl::StrCat("size ", size, " bytes, expected ", expected));
  // All offsets below are multiples of 8 from the page-aligned mapping.
  const auto* errors = reinterpret_cast<const IndexError*>(bytes.data() + sizeof(Header));
  const auto* records = reinterpret_cast<const SequenceEntry*>(bytes.data() + records_offset);
  const auto* block_sums = reinterpret_cast<const uint64_t*>(bytes.data() + sums_offset);
  uint64_t stored_sum;
  std::memcpy(&stored_sum, bytes.data() + size - sizeof(uint64_t), sizeof(uint64_t));
  if (FrameSum(h, errors, block_sums, blocks) != stored_sum) {
    return corrupt("checksum mismatch (header, errors or block sums)");
  }
  // A header that checks out and describes another file (or configuration) is stale; one
  // damaged is corrupt (above), whichever field the damage hit.
  if (h.data_size != data_stamp.size || h.data_mtime_ns != data_stamp.mtime_ns) {
    return absl::FailedPreconditionError(
        absl::StrCat(cache_path, ": stale index cache (the data file changed)"));
  }
  if (h.data_sample_hash != data_stamp.sample_hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        cache_path, ": stale index cache (the data file's contents changed, its size and mtime kept)"));
  }
  if (h.config_hash != config_hash) {
    return absl::FailedPreconditionError(
        absl::StrCat(cache_path, ": index cache was built for another configuration"));
  }
  // The records: each block against its sum, each record against the data size: a cache must
  // never send a reader out of bounds. The content hash is the stored one (the writer's
  // Index::content_hash), not recomputed: that was a serial pass over all records.
  const RecordCheck check{file.get(),      records,    records_offset, h.num_sequences,
                          h.block_records, block_sums, h.data_size};
  RecordProblem problem = CheckRecords(check, blocks, threads);
  if (problem.record != UINT64_MAX) return corrupt(problem.what);

  Index index;
  index.keys_are_line_numbers = (h.flags & 1u) != 0;
  index.file_size = h.data_size;
  index.errors.count = h.error_count;
  index.errors.first.assign(errors, errors + h.kept_lines);
  index.content_hash = h.content_hash;
  index.sequences = SequenceTable::Borrowed(std::move(file), records, h.num_sequences);
  return std::optional<Index>(std::move(index));
}

}  // namespace conveyor
