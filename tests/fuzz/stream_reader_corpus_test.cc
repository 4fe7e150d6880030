// The stream reader's fuzz corpus (tests/fuzz/corpus/stream_reader_fuzzer) through its
// harness in every build, not only the clang fuzzing one (scripts/fuzz.sh): each message
// parsed as the client parses it must agree with protobuf, and no stream may crash it.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

TEST(StreamReaderCorpus, EveryStreamIsReadWithoutCrashing) {
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(CONVEYOR_STREAM_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0) << entry.path();
    ++files;
  }
  EXPECT_GT(files, 10u);
}
