// The CTF index: sequences, chunks, parallel == serial, and the index cache's invalidation.
#include <sys/stat.h>
#include <utime.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/formats/ctf/ctf_indexer.h"
#include "common/index/index_cache.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

bool SameSequences(const Index& a, const Index& b) {
  if (a.sequences.size() != b.sequences.size()) return false;
  return std::memcmp(a.sequences.data(), b.sequences.data(), a.sequences.size() * sizeof(SequenceEntry)) == 0;
}

std::string Generated(size_t lines, bool ids) {
  std::string s;
  for (size_t i = 0; i < lines; ++i) {
    if (ids) s += std::to_string(i / 5) + " ";
    s += "|a " + std::to_string(i % 97) + " 0.5 0.25 |b " + std::to_string(i % 13) + ":1\n";
  }
  return s;
}

TEST(CtfIndex, FindsSequencesAndSampleCounts) {
  const std::string data = "100 |a 1\n100 |a 2\n|a 3\n200 |a 4\n\n300 |a 5\n";
  auto index = BuildCtfIndex(data, "x.ctf", CtfIndexOptions());
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->sequences.size(), 3u);
  EXPECT_EQ(index->sequences[0].key, 100u);
  EXPECT_EQ(index->sequences[0].num_samples, 3u);
  EXPECT_EQ(index->sequences[0].offset, 0u);
  EXPECT_EQ(index->sequences[0].size, 23u);
  EXPECT_EQ(index->sequences[1].key, 200u);
  EXPECT_EQ(index->sequences[1].line, 3u);
  EXPECT_EQ(index->sequences[2].key, 300u);
  EXPECT_EQ(index->sequences[2].line, 5u);
  EXPECT_EQ(index->total_samples, 5u);
  EXPECT_EQ(index->errors.count, 1u);  // the blank row between 200 and 300
  ASSERT_EQ(index->errors.first.size(), 1u);
  EXPECT_EQ(index->errors.first[0].line, 4u);
}

TEST(CtfIndex, TrailingBlankLinesAreNotErrors) {
  auto index = BuildCtfIndex("|a 1\n|a 2\n\n \n", "x.ctf", CtfIndexOptions());
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->sequences.size(), 2u);
  EXPECT_EQ(index->errors.count, 0u);
}

TEST(CtfIndex, ChunksNeverSplitASequenceAndRespectTheSize) {
  const std::string data = Generated(1000, true);
  CtfIndexOptions io;
  io.chunk_size = 300;
  auto index = BuildCtfIndex(data, "x.ctf", io);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->sequences.size(), 200u);
  uint64_t seqs = 0;
  for (const ChunkEntry& c : index->chunks) {
    EXPECT_EQ(c.first_sequence, seqs);
    const SequenceEntry& first = index->sequences[c.first_sequence];
    EXPECT_EQ(c.begin_offset, first.offset);
    EXPECT_TRUE(c.num_sequences == 1 || c.end_offset - c.begin_offset <= io.chunk_size);
    seqs += c.num_sequences;
  }
  EXPECT_EQ(seqs, 200u);
}

TEST(CtfIndex, DefinesMBSizeCountsRowsWithThatStream) {
  CtfIndexOptions io;
  io.main_alias = "c";
  auto index = BuildCtfIndex("0 |w 1 |c 1\n0 |w 2\n1 |w 3\n2 |w 4 |cc 2\n2 |c 9\n", "x.ctf", io);
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->sequences.size(), 2u);  // sequence 1 has no `c` row: not indexed
  EXPECT_EQ(index->sequences[0].num_samples, 1u);
  EXPECT_EQ(index->sequences[1].key, 2u);
  EXPECT_EQ(index->sequences[1].num_samples, 1u);
}

TEST(CtfIndex, ParallelAndSerialGiveTheSameIndex) {
  for (bool ids : {true, false}) {
    // ~14 MiB: several 4 MiB ranges, boundaries falling inside multi-line sequences.
    const std::string data = Generated(400000, ids);
    CtfIndexOptions serial, parallel;
    serial.threads = 1;
    parallel.threads = 4;
    serial.chunk_size = parallel.chunk_size = 1 << 20;
    auto a = BuildCtfIndex(data, "x.ctf", serial);
    auto b = BuildCtfIndex(data, "x.ctf", parallel);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->sequences.size(), ids ? 80000u : 400000u);
    EXPECT_TRUE(SameSequences(*a, *b)) << "ids=" << ids;
    EXPECT_EQ(a->chunks.size(), b->chunks.size());
    EXPECT_EQ(a->total_samples, b->total_samples);
  }
}

TEST(CtfIndex, ParallelMergesContinuationRowsAcrossRanges) {
  // One sequence spanning every range: ids only on its first row.
  std::string data = "7 |a 1\n";
  for (int i = 0; i < 900000; ++i) data += "|a 2\n";
  data += "8 |a 3\n";
  CtfIndexOptions io;
  io.threads = 4;
  auto index = BuildCtfIndex(data, "x.ctf", io);
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->sequences.size(), 2u);
  EXPECT_EQ(index->sequences[0].num_samples, 900001u);
  EXPECT_EQ(index->sequences[1].key, 8u);
}

// The index of `data` read through CtfIndexOptions::read (from `data` itself, a window of
// `window` bytes at a time), counting the reads.
absl::StatusOr<Index> IndexRead(const std::string& data, CtfIndexOptions io, uint64_t window,
                                std::atomic<int>* reads = nullptr) {
  io.read_window = window;
  io.read = [&data, reads](uint64_t offset, uint64_t length, char* out) {
    EXPECT_LE(offset + length, data.size());
    std::memcpy(out, data.data() + offset, length);
    if (reads != nullptr) ++*reads;
    return absl::OkStatus();
  };
  return BuildCtfIndex(data, "x.ctf", io);
}

bool SameIndex(const Index& a, const Index& b) {
  if (!SameSequences(a, b) || a.chunks.size() != b.chunks.size() || a.total_samples != b.total_samples ||
      a.errors.count != b.errors.count || a.errors.first.size() != b.errors.first.size())
    return false;
  for (size_t i = 0; i < a.errors.first.size(); ++i) {
    if (a.errors.first[i].line != b.errors.first[i].line || a.errors.first[i].kind != b.errors.first[i].kind) return false;
  }
  return true;
}

// Read a window at a time (what `conveyor index` and the datasets do), every window size
// from one byte up gives the index the mapping gives: lines across windows, lines longer
// than a window, no final newline, blank and repeated-id rows, per-line mode, and serial and
// parallel ranges.
TEST(CtfIndex, ReadAWindowAtATimeGivesTheSameIndex) {
  std::string long_line = "9 |a";
  for (int i = 0; i < 3000; ++i) long_line += " 0.5";
  const std::vector<std::string> texts = {
      "100 |a 1\n100 |a 2\n|a 3\n200 |a 4\n\n300 |a 5\n",
      "100 |a 1\n100 |a 2\n|a 3\n200 |a 4\n\n300 |a 5",  // no final newline
      "|a 1\n\n|a 2 |c 1\n  \n|a 3\n\n\n",
      "1 |a 1\n2 |a 2\n1 |a 3\n" + long_line + "\n" + long_line + "\n3 |c 1 |a 2\n",
      long_line,
      Generated(300, true),
      Generated(300, false),
  };
  for (const std::string& text : texts) {
    for (const std::string alias : {"", "c"}) {
      CtfIndexOptions io;
      io.main_alias = alias;
      io.chunk_size = 256;
      auto mapped = BuildCtfIndex(text, "x.ctf", io);
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      for (uint64_t window : {1, 2, 3, 7, 16, 100, 4096, 1 << 20}) {
        auto read = IndexRead(text, io, window);
        ASSERT_TRUE(read.ok()) << read.status();
        EXPECT_TRUE(SameIndex(*mapped, *read)) << "window " << window << ", alias '" << alias << "':\n" << text.substr(0, 200);
      }
    }
  }
  // Several ranges (4 MiB each at least), each read in windows.
  for (bool ids : {true, false}) {
    const std::string data = Generated(400000, ids);
    CtfIndexOptions io;
    io.threads = 4;
    io.chunk_size = 1 << 20;
    auto mapped = BuildCtfIndex(data, "x.ctf", io);
    std::atomic<int> reads{0};  // from each range's thread
    auto read = IndexRead(data, io, 64 << 10, &reads);
    ASSERT_TRUE(mapped.ok() && read.ok());
    EXPECT_TRUE(SameIndex(*mapped, *read)) << "ids=" << ids;
    EXPECT_GE(reads.load(), static_cast<int>(data.size() / (64 << 10))) << "the ranges were not read in windows";
  }
}

// A line longer than kMaxReadWindow is scanned through the mapping, not read into a buffer
// as long as itself; the lines after it are read again.
TEST(CtfIndex, ALineLongerThanTheLargestWindowIsScannedThroughTheMapping) {
  std::string data = "1 |a 1\n2 |a";
  data.append(CtfIndexOptions::kMaxReadWindow + 100, ' ');
  data += "1\n3 |a 1\n";
  CtfIndexOptions io;
  io.threads = 1;
  uint64_t largest = 0;
  io.read = [&](uint64_t offset, uint64_t length, char* out) {
    largest = std::max(largest, length);
    std::memcpy(out, data.data() + offset, length);
    return absl::OkStatus();
  };
  auto index = BuildCtfIndex(data, "x.ctf", io);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->sequences.size(), 3u);
  EXPECT_EQ(index->sequences[1].size, data.size() - 7 - 7);
  EXPECT_EQ(index->sequences[2].key, 3u);
  EXPECT_EQ(largest, CtfIndexOptions::kMaxReadWindow) << "the window stops doubling at the cap, not before";
}

// A failed read ends the index with the read's own error (what MappedFile::Read says of a
// file cut short or an I/O error), from whichever range met it.
TEST(CtfIndex, AFailedReadIsTheIndexsError) {
  const std::string data = Generated(400000, true);
  for (int threads : {1, 4}) {
    CtfIndexOptions io;
    io.threads = threads;
    io.read_window = 64 << 10;
    io.read = [&](uint64_t offset, uint64_t length, char* out) {
      if (offset + length > data.size() / 2) return absl::DataLossError("x.ctf: the file ends at byte 1234");
      std::memcpy(out, data.data() + offset, length);
      return absl::OkStatus();
    };
    auto index = BuildCtfIndex(data, "x.ctf", io);
    ASSERT_FALSE(index.ok()) << threads;
    EXPECT_TRUE(absl::IsDataLoss(index.status()));
    EXPECT_EQ(index.status().message(), "x.ctf: the file ends at byte 1234");
  }
}

class IndexCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.Write("d.ctf", Generated(500, true));
    config_ = CtfDataset(data_, "{a: {dim: 3, format: dense}, b: {dim: 13, format: sparse}}", "cacheIndex: true");
  }
  IndexSource Open() {
    auto ds = Dataset::Open(config_);
    EXPECT_TRUE(ds.ok()) << ds.status();
    if (!ds.ok()) return IndexSource::kBuilt;
    EXPECT_EQ((*ds)->index().sequences.size(), 100u);
    cache_ = (*ds)->index_cache_path();
    return (*ds)->index_source();
  }
  TempDir dir_;
  std::string data_, cache_;
  DatasetConfig config_;
};

TEST_F(IndexCacheTest, SecondOpenUsesTheCache) {
  EXPECT_EQ(Open(), IndexSource::kBuilt);
  struct stat st;
  ASSERT_EQ(::stat(cache_.c_str(), &st), 0) << cache_;
  EXPECT_EQ(Open(), IndexSource::kCache);
}

TEST_F(IndexCacheTest, TouchedDataFileInvalidatesTheCache) {
  Open();
  struct utimbuf times = {1000000000, 1000000000};
  ASSERT_EQ(::utime(data_.c_str(), &times), 0);
  EXPECT_EQ(Open(), IndexSource::kRebuiltStaleCache);
  EXPECT_EQ(Open(), IndexSource::kCache);
}

TEST_F(IndexCacheTest, TruncatedCacheIsRebuilt) {
  Open();
  ASSERT_EQ(::truncate(cache_.c_str(), 100), 0);
  EXPECT_EQ(Open(), IndexSource::kRebuiltBadCache);
  EXPECT_EQ(Open(), IndexSource::kCache);
}

TEST_F(IndexCacheTest, CorruptCacheIsRebuilt) {
  Open();
  std::string bytes = ReadFile(cache_);
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(cache_, std::ios::binary) << bytes;
  EXPECT_EQ(Open(), IndexSource::kRebuiltBadCache);
}

// A cache written by an older build (format version 3) is stale: rebuilt, then rewritten in
// the current format and used.
TEST_F(IndexCacheTest, OldVersionCacheIsRebuilt) {
  Open();
  std::string bytes = ReadFile(cache_);
  const uint32_t v3 = 3;
  std::memcpy(&bytes[8], &v3, sizeof(v3));
  std::ofstream(cache_, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(Open(), IndexSource::kRebuiltStaleCache);
  EXPECT_EQ(Open(), IndexSource::kCache);
}

TEST_F(IndexCacheTest, OtherConfigurationUsesAnotherCache) {
  Open();
  const std::string first = cache_;
  config_.deserializers[0].skip_sequence_ids = true;
  auto ds = Dataset::Open(config_);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->index_source(), IndexSource::kBuilt);
  EXPECT_NE((*ds)->index_cache_path(), first);
}

TEST(IndexCacheFile, RefusesRecordsOutsideTheDataFile) {
  TempDir dir;
  Index index;
  index.sequences.push_back({1, 10, 0, 50, 1});
  const std::string path = dir.path() + "/x.cvyidx";
  ASSERT_TRUE(WriteIndexCache(path, index, FileStamp{40, 5}, 9).ok());
  auto read = ReadIndexCache(path, FileStamp{40, 5}, 9);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  auto ok = ReadIndexCache(path, FileStamp{40, 5}, 8);
  EXPECT_EQ(ok.status().code(), absl::StatusCode::kFailedPrecondition);
}


// A cache larger than one checksummed block (ReadIndexCache checks the records 1 MiB at a
// time): the records, the errors and the content hash come back as written, and a flipped
// byte or an out-of-range record in a late block is still caught.
TEST(IndexCacheFile, LargeCacheRoundTripsBlockByBlock) {
  TempDir dir;
  Index index;
  constexpr uint64_t kRecords = 300001;  // > 9 blocks of 1 MiB, and not a multiple of one
  for (uint64_t i = 0; i < kRecords; ++i) index.sequences.push_back({i * 3, i * 10, i, 10, static_cast<uint32_t>(1 + i % 5)});
  index.errors.count = 7;
  index.errors.first.push_back({IndexError::kRepeatedId, 42, 40, 9});
  index.ComputeContentHash();
  const uint64_t data_size = kRecords * 10;
  const std::string path = dir.path() + "/big.cvyidx";
  ASSERT_TRUE(WriteIndexCache(path, index, FileStamp{data_size, 5}, 9).ok());
  auto read = ReadIndexCache(path, FileStamp{data_size, 5}, 9);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  const Index& back = **read;
  EXPECT_TRUE(SameSequences(back, index));
  EXPECT_EQ(back.content_hash, index.content_hash);
  EXPECT_EQ(back.errors.count, 7u);
  ASSERT_EQ(back.errors.first.size(), 1u);
  EXPECT_EQ(back.errors.first[0].line, 42u);

  std::string bytes = ReadFile(path);
  bytes[bytes.size() - 100] ^= 0x01;  // inside the last block's records
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  auto flipped = ReadIndexCache(path, FileStamp{data_size, 5}, 9);
  ASSERT_FALSE(flipped.ok());
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);

  // A data file one byte shorter than the last record's end: refused even with a good checksum.
  ASSERT_TRUE(WriteIndexCache(path, index, FileStamp{data_size - 1, 5}, 9).ok());
  auto outside = ReadIndexCache(path, FileStamp{data_size - 1, 5}, 9);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace conveyor::testing
