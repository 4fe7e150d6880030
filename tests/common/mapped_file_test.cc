// MappedFile: the mapping, and Read(), which copies a range with pread(2) instead (how a
// chunk to parse is read: chunked_file.h): exact bytes at any offset, a clear error where the
// file no longer holds the range, and none without a descriptor kept for it.
#include "common/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 251) & 0xFF);
  return s;
}

TEST(MappedFile, ReadCopiesExactlyTheRangeAsked) {
  TempDir dir;
  const std::string bytes = Pattern(3 << 20);  // past one 2 MiB block
  auto f = MappedFile::Open(dir.Write("f.bin", bytes), /*readable=*/true);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->bytes(), bytes);
  for (auto [offset, length] : std::initializer_list<std::pair<uint64_t, uint64_t>>{
           {0, 0}, {0, 1}, {1, 4095}, {4095, 2}, {12345, 2 << 20}, {0, 3 << 20}, {(3 << 20) - 7, 7}}) {
    std::string out(length + 2, '#');
    ASSERT_TRUE((*f)->Read(offset, length, out.data() + 1).ok()) << offset << "+" << length;
    EXPECT_EQ(out.substr(1, length), bytes.substr(offset, length)) << offset << "+" << length;
    EXPECT_EQ(out.front(), '#');  // nothing written outside the range
    EXPECT_EQ(out.back(), '#');
  }
}

TEST(MappedFile, ReadPastTheEndOfAFileCutShortIsDataLossNamingTheFile) {
  TempDir dir;
  const std::string path = dir.Write("cut.bin", Pattern(10000));
  auto f = MappedFile::Open(path, /*readable=*/true);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(::truncate(path.c_str(), 6000), 0);
  std::string out(5000, '\0');
  // Within what is left: the bytes are there, but the file is no longer the one indexed.
  const absl::Status left = (*f)->Read(1000, 5000, out.data());
  EXPECT_EQ(left.code(), absl::StatusCode::kDataLoss) << left;
  EXPECT_NE(left.message().find("cut.bin: the file was changed after it was opened (10000 bytes"), std::string::npos)
      << left;
  const absl::Status st = (*f)->Read(5000, 5000, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("cut.bin: the file ends at byte 6000, before byte 10000"), std::string::npos) << st;
  EXPECT_NE(st.message().find("10000 bytes when opened"), std::string::npos) << st;
  // A read that starts past the new end says where the file ends, not where the read began.
  const absl::Status past = (*f)->Read(8000, 100, out.data());
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss) << past;
  EXPECT_NE(past.message().find("cut.bin: the file ends at byte 6000, before byte 8100"), std::string::npos) << past;
  EXPECT_EQ((*f)->Read(20000, 1, out.data()).code(), absl::StatusCode::kDataLoss);
}

// Sets the file's mtime to `sec` seconds (and `nsec`) since the epoch.
void SetMtime(const std::string& path, time_t sec, long nsec) {
  struct timespec times[2] = {{sec, nsec}, {sec, nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// Rewritten in place with its size kept (a generator run again over the same path): a read
// returns the new bytes, which the index made at open does not describe. DataLoss naming the
// file, both stamps and what to do, instead of parsing them as the old file's.
TEST(MappedFile, ReadOfAFileRewrittenInPlaceIsDataLoss) {
  TempDir dir;
  const std::string bytes = Pattern(10000);
  const std::string path = dir.Write("same.bin", bytes);
  SetMtime(path, 1700000000, 5);
  auto f = MappedFile::Open(path, /*readable=*/true);
  ASSERT_TRUE(f.ok()) << f.status();
  std::string out(100, '\0');
  ASSERT_TRUE((*f)->Read(0, 100, out.data()).ok());
  {
    std::string changed = bytes;
    changed[50] ^= 1;
    FILE* w = std::fopen(path.c_str(), "r+b");  // in place: the same inode, the same size
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(std::fwrite(changed.data(), 1, changed.size(), w), changed.size());
    ASSERT_EQ(std::fclose(w), 0);
  }
  SetMtime(path, 1700000000, 6);  // one nanosecond later: any change of the mtime counts
  const absl::Status st = (*f)->Read(0, 100, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("same.bin: the file was changed after it was opened (10000 bytes, modified "
                              "2023-11-14 22:13:20.000000005 UTC; now 10000 bytes, modified 2023-11-14 "
                              "22:13:20.000000006 UTC)"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("renaming a new one over it"), std::string::npos) << st;
  // A time before 1970 prints as the calendar says (floor division of the nanoseconds).
  SetMtime(path, -1, 250000000);
  const absl::Status old = (*f)->Read(0, 100, out.data());
  EXPECT_NE(old.message().find("now 10000 bytes, modified 1969-12-31 23:59:59.250000000 UTC"), std::string::npos) << old;
}

// Harmless changes: a new mtime over the same bytes (`touch`, a copy tool setting times) and
// bytes appended after those opened (a producer still writing) keep the file readable,
// through a descriptor (Read) and by path (CheckUnchanged); a rewrite after either is still
// caught, and a cut never passes.
TEST(MappedFile, ATouchOrAnAppendIsNoChange) {
  TempDir dir;
  const std::string bytes = Pattern(300000);  // sampled in pieces, not hashed whole
  for (const bool readable : {true, false}) {
    SCOPED_TRACE(readable ? "Read()" : "CheckUnchanged()");
    const std::string path = dir.Write(readable ? "r.bin" : "m.bin", bytes);
    SetMtime(path, 1700000000, 0);
    auto f = MappedFile::Open(path, readable);
    ASSERT_TRUE(f.ok()) << f.status();
    std::string out(100, '\0');
    auto check = [&] { return readable ? (*f)->Read(1000, 100, out.data()) : (*f)->CheckUnchanged(); };
    ASSERT_TRUE(check().ok());  // (the first check samples the file as opened)
    SetMtime(path, 1700000100, 0);  // touch
    EXPECT_TRUE(check().ok()) << check();
    {
      FILE* a = std::fopen(path.c_str(), "ab");  // append
      ASSERT_NE(a, nullptr);
      ASSERT_EQ(std::fwrite("tail", 1, 4, a), 4u);
      ASSERT_EQ(std::fclose(a), 0);
    }
    SetMtime(path, 1700000200, 0);
    EXPECT_TRUE(check().ok()) << check();
    EXPECT_TRUE(check().ok()) << check();  // (the new stamp is the one compared with now)
    {
      FILE* w = std::fopen(path.c_str(), "r+b");  // then a rewrite of a sampled piece
      ASSERT_NE(w, nullptr);
      ASSERT_EQ(std::fwrite("XXXX", 1, 4, w), 4u);
      ASSERT_EQ(std::fclose(w), 0);
    }
    SetMtime(path, 1700000300, 0);
    const absl::Status st = check();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("the file was changed after it was opened"), std::string::npos) << st;
  }
  // Cut short by a byte: refused, whatever the pieces.
  const std::string path = dir.Write("c.bin", bytes);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->CheckUnchanged().ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(bytes.size() - 1)), 0);
  EXPECT_EQ((*f)->CheckUnchanged().code(), absl::StatusCode::kDataLoss);
}

// Replaced the way docs/ctf.md asks (a new file renamed over the path): the descriptor still
// reads the file opened, unchanged, which its index describes.
TEST(MappedFile, AFileRenamedOverTheOneOpenedIsNoChange) {
  TempDir dir;
  const std::string bytes = Pattern(10000);
  const std::string path = dir.Write("kept.bin", bytes);
  auto f = MappedFile::Open(path, /*readable=*/true);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string fresh = dir.Write("fresh.bin", Pattern(20000).substr(5000, 10000));
  ASSERT_EQ(std::rename(fresh.c_str(), path.c_str()), 0);
  std::string out(10000, '\0');
  ASSERT_TRUE((*f)->Read(0, 10000, out.data()).ok());
  EXPECT_EQ(out, bytes);
}

// The sample hash: the same for the same bytes, another when any sampled piece or the size
// differs; a small file is hashed whole.
TEST(MappedFile, SampleHashSeesChangedPiecesAndSizes) {
  TempDir dir;
  const std::string big = Pattern(1 << 20);
  auto hash_of = [&](const std::string& name, const std::string& bytes) -> uint64_t {
    auto f = MappedFile::Open(dir.Write(name, bytes));
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? (*f)->SampleHash() : 0;
  };
  const uint64_t h = hash_of("a", big);
  EXPECT_EQ(hash_of("b", big), h);
  const uint64_t piece_gap = ((1 << 20) - 4096) / 15;
  for (uint64_t at : {uint64_t{0}, uint64_t{4095}, piece_gap, 7 * piece_gap + 100, uint64_t{(1 << 20) - 1}}) {
    std::string changed = big;
    changed[at] ^= 0x40;
    EXPECT_NE(hash_of("c", changed), h) << "byte " << at;
  }
  EXPECT_NE(hash_of("d", big + "x"), h);
  std::string small = Pattern(60000);
  const uint64_t hs = hash_of("e", small);
  small[33333] ^= 1;  // anywhere in a small file
  EXPECT_NE(hash_of("f", small), hs);
  EXPECT_NE(hash_of("g", ""), hash_of("h", std::string(1, '\0')));
}

// A read of the mapping itself past the end of a file cut short: a SIGBUS would end the
// process; the page reads as zeros instead, and CheckReads() names the file from then on.
TEST(MappedFile, AReadOfTheMappingPastTheEndOfAFileCutShortIsReportedNotASigbus) {
  TempDir dir;
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::string bytes = Pattern(4 * page);
  const std::string path = dir.Write("cut.bin", bytes);
  const std::string other = dir.Write("other.bin", bytes);
  auto f = MappedFile::Open(path);
  auto g = MappedFile::Open(other);
  ASSERT_TRUE(f.ok() && g.ok());
  const volatile char* p = (*f)->bytes().data();
  EXPECT_EQ(p[3 * page + 5], bytes[3 * page + 5]);  // read once before the cut: in the page tables
  EXPECT_TRUE(MappedFile::CheckReads({path, other}).ok());
  ASSERT_EQ(::truncate(path.c_str(), page + 100), 0);
  const uint64_t before = MappedFile::CutShortReads();
  EXPECT_EQ(p[page + 50], bytes[page + 50]);  // still in the file
  EXPECT_EQ(p[page + 200], 0);                // past the end, in its last page: zeros, no fault
  EXPECT_EQ(MappedFile::CutShortReads(), before);
  EXPECT_EQ(p[3 * page + 5], 0);              // a page wholly past the end: faults, reads zeros
  EXPECT_EQ(p[3 * page + 6], 0);              // (given zeros once: no second fault)
  EXPECT_EQ(MappedFile::CutShortReads(), before + 1);
  const absl::Status st = MappedFile::CheckReads({other, path});
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(path + ": the file was cut short after it was opened: a read at byte " +
                              std::to_string(3 * page + 5) + " found no data (it was " + std::to_string(4 * page) +
                              " bytes when opened"),
            std::string::npos)
      << st;
  EXPECT_TRUE(MappedFile::CheckReads({other}).ok());  // another file's mapping is not concerned
  EXPECT_EQ(MappedFile::CheckReads({path}).code(), absl::StatusCode::kDataLoss);  // and it stays so
  // Once its mapping is gone, a new mapping of the same file is not marked by the old fault.
  f->reset();
  auto again = MappedFile::Open(path);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(MappedFile::CheckReads({path}).ok());
}

// The handler hides faults in MappedFile's mappings only: one in any other mapping of a file
// cut short (a device's, another library's) and a SIGBUS sent with kill(2) end the process
// as they did before it was installed.
TEST(MappedFileDeathTest, OtherSigbusesKeepTheirDefaultAction) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  TempDir dir;
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::string path = dir.Write("raw.bin", Pattern(4 * page));
  auto installed = MappedFile::Open(dir.Write("any.bin", "x"));  // the handler is in place
  ASSERT_TRUE(installed.ok());
  EXPECT_EXIT(
      {
        const int fd = ::open(path.c_str(), O_RDONLY);
        const volatile char* p =
            static_cast<const char*>(::mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE, fd, 0));
        (void)!::ftruncate(::open(path.c_str(), O_WRONLY), page);
        std::printf("%d\n", p[3 * page]);  // past the end, not a MappedFile's: SIGBUS
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
  EXPECT_EXIT(
      {
        ::kill(::getpid(), SIGBUS);
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// Data comes from regular files: a FIFO would wait for a writer forever and a device would
// read as an empty dataset; both are refused at once, naming what they are.
TEST(MappedFile, OnlyRegularFilesAreOpened) {
  TempDir dir;
  const std::string fifo = dir.path() + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = MappedFile::Open(fifo);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("pipe: is a FIFO (named pipe), expected a data file"), std::string::npos)
      << f.status();
  auto z = MappedFile::Open("/dev/zero");
  EXPECT_NE(z.status().message().find("/dev/zero: is a character device"), std::string::npos) << z.status();
  auto d = MappedFile::Open(dir.path());
  EXPECT_NE(d.status().message().find(": is a directory"), std::string::npos) << d.status();
}

TEST(MappedFile, ReadNeedsTheFileKeptOpen) {
  TempDir dir;
  auto f = MappedFile::Open(dir.Write("f.bin", "abc"));
  ASSERT_TRUE(f.ok()) << f.status();
  char c = 0;
  const absl::Status st = (*f)->Read(0, 1, &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("f.bin"), std::string::npos) << st;
}

}  // namespace
}  // namespace conveyor::testing
