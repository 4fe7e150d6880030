// The index cache file, format version 5: records used in place from the mapping (SequenceTable),
// block checksums, and every way a cache file can be wrong (flipped bytes, truncation, records
// past the data's end, an older format version): refused with DataLoss or FailedPrecondition,
// never a crash, never wrong data.
#include "common/index/index_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/dataset/dataset.h"
#include "common/hash.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

constexpr uint64_t kStampMtime = 5;
constexpr uint64_t kConfigHash = 9;
constexpr uint64_t kHeaderBytes = 80;

// `n` records, back to back, 10 bytes each: data file of n * 10 bytes.
Index MakeIndex(uint64_t n) {
  Index index;
  for (uint64_t i = 0; i < n; ++i) {
    index.sequences.push_back({i * 3, i * 10, i, 10, static_cast<uint32_t>(1 + i % 5)});
  }
  index.errors.count = 3;
  index.errors.first.push_back({IndexError::kBlankRow, 17, 0, 0});
  index.ComputeContentHash();
  return index;
}

FileStamp Stamp(uint64_t data_size) { return FileStamp{data_size, kStampMtime}; }

void Overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string Load(const std::string& path, uint64_t data_size, absl::Status* status) {
  auto read = ReadIndexCache(path, Stamp(data_size), kConfigHash);
  *status = read.status();
  return read.ok() ? "" : std::string(read.status().message());
}

// `index` written as the cache at `path` (of a data file of `data_size` bytes) and read back;
// an empty index, after a test failure, when either step fails.
Index WriteAndRead(const std::string& path, const Index& index, uint64_t data_size) {
  if (absl::Status st = WriteIndexCache(path, index, Stamp(data_size), kConfigHash); !st.ok()) {
    ADD_FAILURE() << "writing " << path << ": " << st;
    return Index();
  }
  auto read = ReadIndexCache(path, Stamp(data_size), kConfigHash);
  if (!read.ok() || !read->has_value()) {
    ADD_FAILURE() << "reading " << path << ": " << (read.ok() ? "refused as stale" : read.status().ToString());
    return Index();
  }
  return std::move(**read);
}

TEST(IndexCacheV5, LoadedRecordsAreUsedInPlace) {
  TempDir dir;
  const Index index = MakeIndex(1000);
  const std::string path = dir.path() + "/x.cvyidx";
  const Index back = WriteAndRead(path, index, 10000);
  EXPECT_TRUE(back.sequences.borrowed());
  ASSERT_EQ(back.sequences.size(), 1000u);
  EXPECT_EQ(
      std::memcmp(back.sequences.data(), index.sequences.data(), 1000 * sizeof(SequenceEntry)), 0);
  EXPECT_EQ(back.sequences[999].offset, 9990u);
  // The content hash cursors carry: stored, and the value ComputeContentHash gives.
  EXPECT_EQ(back.content_hash, index.content_hash);
  EXPECT_EQ(back.content_hash, Hash64(index.sequences.data(), 1000 * sizeof(SequenceEntry)));
  EXPECT_EQ(back.errors.count, 3u);
  ASSERT_EQ(back.errors.first.size(), 1u);
  EXPECT_EQ(back.errors.first[0].line, 17u);
  // The file: header, one error, the records, one block sum, the checksum.
  EXPECT_EQ(ReadFile(path).size(), kHeaderBytes + 32 + 1000 * 32 + 8 + 8);
}

// The content hash of a known index, as every build since the format began computes it: a
// cursor written by an older build names this value, so it must not change.
TEST(IndexCacheV5, ContentHashValueIsStable) {
  Index index;
  index.sequences.push_back({7, 0, 0, 12, 2});
  index.sequences.push_back({9, 12, 2, 30, 5});
  index.ComputeContentHash();
  EXPECT_EQ(index.content_hash, 0xbd3e53d02906c125ull);
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  EXPECT_EQ(WriteAndRead(path, index, 42).content_hash, 0xbd3e53d02906c125ull);
}

TEST(IndexCacheV5, EmptyIndexRoundTrips) {
  TempDir dir;
  Index index;
  index.ComputeContentHash();
  const std::string path = dir.path() + "/x.cvyidx";
  const Index back = WriteAndRead(path, index, 0);
  EXPECT_TRUE(back.sequences.empty());
  EXPECT_EQ(back.content_hash, index.content_hash);
}

// Flipping any one byte of a small cache, anywhere (header, errors, records, block sums,
// checksum), is refused.
TEST(IndexCacheV5, EveryFlippedByteIsRefused) {
  TempDir dir;
  const Index index = MakeIndex(5);
  const std::string path = dir.path() + "/x.cvyidx";
  ASSERT_TRUE(WriteIndexCache(path, index, Stamp(50), kConfigHash).ok());
  const std::string good = ReadFile(path);
  for (size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] ^= 0x10;
    Overwrite(path, bad);
    absl::Status st;
    Load(path, 50, &st);
    // The version (bytes 8-11) makes another format: stale. Any other damage, the data file's
    // stamp and the configuration's hash included, is corrupt: the checksums are checked
    // before a header is believed enough to call the cache stale.
    if (at >= 8 && at < 12) {
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << "byte " << at << ": " << st;
    } else {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << st;
    }
  }
}

// A flipped byte in the records of a middle block: DataLoss naming that block's records.
TEST(IndexCacheV5, FlippedByteInTheRecordsNamesTheBlock) {
  TempDir dir;
  const Index index = MakeIndex(100000);  // blocks of 32768: three full, one partial
  const std::string path = dir.path() + "/x.cvyidx";
  ASSERT_TRUE(WriteIndexCache(path, index, Stamp(1000000), kConfigHash).ok());
  std::string bytes = ReadFile(path);
  const uint64_t record = 40000;                        // in block 1
  bytes[kHeaderBytes + 32 + record * 32 + 20] ^= 0x01;  // its `line`: no bounds check would see it
  Overwrite(path, bytes);
  absl::Status st;
  const std::string msg = Load(path, 1000000, &st);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(
      msg.find(
          "corrupt index cache: records 32768-65535 (bytes 1048688-2097264) fail their checksum"),
      std::string::npos)
      << msg;
}

TEST(IndexCacheV5, TruncatedOrExtendedFileIsRefused) {
  TempDir dir;
  const Index index = MakeIndex(40000);
  const std::string path = dir.path() + "/x.cvyidx";
  ASSERT_TRUE(WriteIndexCache(path, index, Stamp(400000), kConfigHash).ok());
  const std::string good = ReadFile(path);
  for (size_t keep : {size_t{0}, size_t{4}, size_t{12}, size_t{79}, size_t{80}, size_t{88},
                      good.size() / 2, good.size() - 16, good.size() - 8, good.size() - 1}) {
    Overwrite(path, good.substr(0, keep));
    absl::Status st;
    const std::string msg = Load(path, 400000, &st);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << keep << ": " << st;
    EXPECT_NE(msg.find("corrupt index cache"), std::string::npos) << msg;
  }
  Overwrite(path, good + "x");
  absl::Status st;
  const std::string msg = Load(path, 400000, &st);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(msg.find(absl::StrCat("size ", good.size() + 1, " bytes, expected ", good.size())),
            std::string::npos)
      << msg;
}

// Records with good checksums that would send a reader out of bounds: refused, naming the
// record and where it is in the cache file.
TEST(IndexCacheV5, RecordPastTheDataEndIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  struct Case {
    const char* name;
    SequenceEntry bad;
  };
  const Case cases[] = {
      {"past the end", {5, 50, 5, 11, 1}},  // ends at 61 > 60
      {"starts past the end", {5, 70, 5, 1, 1}},
      {"wraps around", {5, UINT64_MAX - 4, 5, 10, 1}},  // offset + size wraps to 5
      {"overlaps", {5, 45, 5, 10, 1}},                  // previous ends at 50
      {"empty", {5, 50, 5, 0, 1}},
  };
  for (const Case& c : cases) {
    Index index = MakeIndex(6);  // data file: 60 bytes
    index.sequences[5] = c.bad;
    index.ComputeContentHash();
    ASSERT_TRUE(WriteIndexCache(path, index, Stamp(60), kConfigHash).ok());
    absl::Status st;
    const std::string msg = Load(path, 60, &st);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.name << ": " << st;
    EXPECT_NE(msg.find("sequence record 5 (byte 272) lies outside the data file"),
              std::string::npos)
        << c.name << ": " << msg;
  }
  // The same records against a data file one byte longer than the last one needs: accepted.
  Index fits = MakeIndex(6);
  ASSERT_TRUE(WriteIndexCache(path, fits, Stamp(61), kConfigHash).ok());
  EXPECT_TRUE(ReadIndexCache(path, Stamp(61), kConfigHash).ok());
}

// A record past the data's end in a late block, checked by another thread than the first:
// still found, and the earliest problem is the one reported.
TEST(IndexCacheV5, ProblemsInLateBlocksAreFoundOnEveryThread) {
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  const uint64_t n = 32768 * 40;  // 40 blocks: two threads' worth
  Index index = MakeIndex(n);
  index.sequences[n - 3].size = 11;  // overlaps the next record
  index.sequences[n - 1].size = 11;  // and the last one passes the end
  index.ComputeContentHash();
  ASSERT_TRUE(WriteIndexCache(path, index, Stamp(n * 10), kConfigHash).ok());
  for (int threads : {1, 2, 4}) {
    auto read = ReadIndexCache(path, Stamp(n * 10), kConfigHash, threads);
    ASSERT_FALSE(read.ok()) << threads;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(read.status().message().find(absl::StrCat("sequence record ", n - 2, " ")),
              std::string::npos)
        << threads << ": " << read.status();
  }
}

// A version-3 cache (what builds before this format wrote): refused as stale with a message
// that says so, never misread.
TEST(IndexCacheV5, OldVersionIsRefusedAsStale) {
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  const Index index = MakeIndex(3);
  ASSERT_TRUE(WriteIndexCache(path, index, Stamp(30), kConfigHash).ok());
  std::string bytes = ReadFile(path);
  const uint32_t v3 = 3;
  std::memcpy(&bytes[8], &v3, sizeof(v3));
  Overwrite(path, bytes);
  absl::Status st;
  const std::string msg = Load(path, 30, &st);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(msg.find("index cache format version 3 (written by an older conveyor), this build "
                     "reads version 5"),
            std::string::npos)
      << msg;
}

// Another process replaces the cache (a new file renamed over it) while an index uses the old
// one in place: the index keeps the old records, unchanged, even after the file is deleted.
TEST(IndexCacheV5, ReplacedCacheLeavesALoadedIndexIntact) {
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  const Index first = MakeIndex(70000);
  const Index loaded = WriteAndRead(path, first, 700000);
  Index second = MakeIndex(70000);
  for (uint64_t i = 0; i < 70000; ++i) second.sequences[i].num_samples = 99;
  ASSERT_TRUE(WriteIndexCache(path, second, Stamp(700000), kConfigHash).ok());
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ASSERT_TRUE(loaded.sequences.borrowed());
  ASSERT_EQ(loaded.sequences.size(), 70000u);
  EXPECT_EQ(
      std::memcmp(loaded.sequences.data(), first.sequences.data(), 70000 * sizeof(SequenceEntry)),
      0);
}

// Non-const use of a borrowed table copies it first (the mapping is read-only); copies are
// owned; moves keep the mapping.
TEST(SequenceTable, BorrowedTableDetachesOnWrite) {
  TempDir dir;
  const std::string path = dir.path() + "/x.cvyidx";
  const Index index = MakeIndex(100);
  Index loaded = WriteAndRead(path, index, 1000);
  ASSERT_TRUE(loaded.sequences.borrowed());

  SequenceTable copy = loaded.sequences;
  EXPECT_FALSE(copy.borrowed());
  EXPECT_EQ(copy.size(), 100u);
  EXPECT_EQ(copy[42].offset, 420u);

  SequenceTable moved = std::move(loaded.sequences);
  EXPECT_TRUE(moved.borrowed());
  EXPECT_TRUE(loaded.sequences.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  const SequenceEntry* mapped = static_cast<const SequenceTable&>(moved).data();

  moved[7].num_samples = 1234;  // non-const: detaches, the mapping is never written
  EXPECT_FALSE(moved.borrowed());
  EXPECT_NE(static_cast<const SequenceTable&>(moved).data(), mapped);
  EXPECT_EQ(moved[7].num_samples, 1234u);
  EXPECT_EQ(moved[8].num_samples, index.sequences[8].num_samples);
  moved.push_back({1, 1000, 100, 1, 1});
  EXPECT_EQ(moved.size(), 101u);
  auto again = ReadIndexCache(path, Stamp(1000), kConfigHash);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->sequences[7].num_samples, index.sequences[7].num_samples);

  HugeVector<SequenceEntry> v = {{5, 0, 0, 1, 1}};
  moved.swap(v);
  EXPECT_EQ(moved.size(), 1u);
  EXPECT_EQ(v.size(), 101u);
  moved.erase(moved.begin(), moved.end());
  EXPECT_TRUE(moved.empty());
}

// Through a Dataset: the second open uses the cache in place, reading every chunk keeps it in
// place (the read path never writes to the index), and what the loader delivers is the same
// as from a freshly built index.
TEST(IndexCacheV5, DatasetReadsTheCacheInPlace) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += std::to_string(i / 3) + " |a " + std::to_string(i % 7) + " 1 2\n";
  const std::string data = dir.Write("d.ctf", text);
  DatasetConfig cached = CtfDataset(data, "{a: {dim: 3, format: dense}}", "cacheIndex: true");
  DatasetConfig plain = CtfDataset(data, "{a: {dim: 3, format: dense}}");
  cached.deserializers[0].chunk_size_in_bytes = 4096;
  plain.deserializers[0].chunk_size_in_bytes = 4096;
  {
    auto ds = Dataset::Open(cached);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->index_source(), IndexSource::kBuilt);
  }
  auto ds = Dataset::Open(cached);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->index_source(), IndexSource::kCache);
  const Index& index = (*ds)->index();
  EXPECT_TRUE(index.sequences.borrowed());
  EXPECT_EQ(index.sequences.size(), 1000u);
  EXPECT_GT(index.chunks.size(), 5u);
  for (uint64_t c = 0; c < index.chunks.size(); ++c) ASSERT_TRUE((*ds)->ParseChunk(c).ok());
  EXPECT_TRUE(index.sequences.borrowed());

  ReadOptions ro;
  ro.minibatch_size = 64;
  ro.cursors = true;
  auto from_cache = DumpDataset(cached, ro);
  auto built = DumpDataset(plain, ro);
  ASSERT_TRUE(from_cache.ok()) << from_cache.status();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(*from_cache, *built);
}

// The data file rewritten with the same size and its mtime put back (`touch -r`, a copy
// with --preserve, or a rewrite within one tick of the kernel's clock): the size and mtime
// match the cache, its sample hash does not, and the index is built again from the new file,
// whose sequences lie elsewhere. (Read with the old records, the new file's lines would be
// cut at the old offsets.)
TEST(IndexCacheV5, ARewriteThatKeepsSizeAndMtimeIsStale) {
  TempDir dir;
  std::string before, after;
  for (int i = 0; i < 600; ++i) before += std::to_string(i) + " |a " + std::to_string(i % 10) + "\n";
  for (int i = 0; after.size() < before.size(); ++i) after += std::to_string(i) + " |a 12345\n";
  after.resize(before.size() - 1);
  after += "\n";
  const std::string data = dir.Write("d.ctf", before);
  struct timespec times[2] = {{1700000000, 0}, {1700000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, data.c_str(), times, 0), 0);
  DatasetConfig config = CtfDataset(data, "{a: {dim: 1, format: dense}}", "cacheIndex: true");
  {
    auto ds = Dataset::Open(config);
    ASSERT_TRUE(ds.ok()) << ds.status();
    ASSERT_EQ((*ds)->index_source(), IndexSource::kBuilt);
    ASSERT_EQ((*ds)->index().sequences.size(), 600u);
  }
  {
    FILE* w = std::fopen(data.c_str(), "r+b");
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(std::fwrite(after.data(), 1, after.size(), w), after.size());
    ASSERT_EQ(std::fclose(w), 0);
  }
  ASSERT_EQ(::utimensat(AT_FDCWD, data.c_str(), times, 0), 0);
  auto ds = Dataset::Open(config);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->index_source(), IndexSource::kRebuiltStaleCache);
  auto fresh = Dataset::Open(CtfDataset(data, "{a: {dim: 1, format: dense}}"));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*ds)->index().sequences.size(), (*fresh)->index().sequences.size());
  EXPECT_EQ((*ds)->index().content_hash, (*fresh)->index().content_hash);
  // And the cache written then serves the next open.
  auto again = Dataset::Open(config);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->index_source(), IndexSource::kCache);
  EXPECT_EQ((*again)->index().content_hash, (*fresh)->index().content_hash);
}

}  // namespace
}  // namespace conveyor::testing
