// test_util.h: helpers shared by conveyor's tests: temporary files, loading a dataset from
// configuration text, reading it through the real loader, and CNTK's control-file output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/dataset_config.h"
#include "common/dataset/dataset.h"
#include "common/sampling/stream_request.h"

namespace conveyor::testing {

// Whether this build (tests, daemon and all: CONVEYOR_SANITIZE is tree-wide) runs under
// AddressSanitizer, whose quarantine keeps freed memory resident: RSS then says nothing of
// what the code holds, and the tests that measure it skip that check. GCC says so with
// __SANITIZE_ADDRESS__, clang (the fuzzers' tree) with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

// The golden files written by CNTK and Kaldi (tests/data; tests/data/README.md).
std::string TestdataDir();

// A fresh directory under $TEST_TMPDIR or /tmp, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  // Writes `contents` to path()/name and returns the full path.
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path);

// A one-deserializer CTF dataset over `file` with the given YAML `input:` body, e.g.
// "{a: {dim: 3, format: dense}}" and extra dataset keys as YAML, e.g. "maxErrors: 2".
DatasetConfig CtfDataset(const std::string& file, const std::string& input_yaml,
                         const std::string& extra_yaml = "");

struct ReadOptions {
  uint64_t minibatch_size = 1000000;
  uint64_t epochs = 1;
  uint64_t epoch_size = 0;  // 0: one sweep
  int threads = 1;
  uint64_t max_batches_per_epoch = UINT64_MAX;
  bool cursors = false;     // print "cursor" on each batch's last line
  StreamRequest request;    // the rest (randomize, seed, rank, world, resume, ...)
  bool compressed_in_place = false;  // DatasetOpenOptions: Kaldi CM left compressed in chunks
};

// Opens the dataset and returns the dump (docs/design.md section 5) of what the loader delivers,
// or the first error. Diagnostics are collected into *messages when given.
absl::StatusOr<std::string> DumpDataset(const DatasetConfig& config, const ReadOptions& options,
                                        std::vector<std::string>* messages = nullptr);

// The tokens CNTK's reader tests write for this dataset (tests/data/README.md, "Facts the
// tests rely on"): per minibatch, per stream, one dense row per non-gap column of CNTK's
// packed layout.
absl::StatusOr<std::vector<std::string>> CntkControlTokens(const DatasetConfig& config,
                                                           const ReadOptions& options);

// Whitespace-separated tokens of a file.
std::vector<std::string> Tokens(const std::string& text);

// A data file cut short after its dataset was opened: opens `config` (one file of two or more
// chunks), cuts the file to `keep` bytes past the start of its last chunk, and parses chunk 0
// (which must be refused as a file changed since it was opened) and then the last one. Returns the last one's status (*last: its
// index entry), or Internal when the setup itself failed.
absl::Status ParseTheLastChunkOfAFileCutShort(const DatasetConfig& config, uint64_t keep, ChunkEntry* last);

// Writes `bytes` over the start of `path` in place (the same inode; the file keeps its size
// when `bytes` is as long) and moves its mtime `seconds` past what it was: a rewrite within
// one tick of the kernel's clock may keep the mtime, which a test must not depend on.
// Errors: the step that failed, naming the path.
absl::Status RewriteInPlace(const std::string& path, const std::string& bytes, int seconds = 1);

// A shell command's exit status (-1 when it did not exit) and its stdout and stderr together.
struct CommandRun {
  int code = -1;
  std::string out;
};
CommandRun RunCommand(const std::string& command);

}  // namespace conveyor::testing
