// MappedFile: the mapping, and Read(), which copies a range with pread(2) instead (how a
// chunk to parse is read: chunked_file.h): exact bytes at any offset, a clear error where the
// file no longer holds the range, and none without a descriptor kept for it.
#include "common/mapped_file.h"

#include <unistd.h>

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
  EXPECT_TRUE((*f)->Read(1000, 5000, out.data()).ok());
  const absl::Status st = (*f)->Read(5000, 5000, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("cut.bin: the file ends at byte 6000, before byte 10000"), std::string::npos) << st;
  EXPECT_NE(st.message().find("10000 bytes when opened"), std::string::npos) << st;
  EXPECT_EQ((*f)->Read(20000, 1, out.data()).code(), absl::StatusCode::kDataLoss);
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
