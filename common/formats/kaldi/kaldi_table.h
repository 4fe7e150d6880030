// kaldi_table.h: a Kaldi table read as Kaldi's sequential readers read it: an rspecifier
// (`ark:` or `scp:` with options), rxfilenames (`file`, `file:offset`, and `cmd |` only when
// pipes are allowed), scp range specifiers, archives of concatenated binary and text objects.
// Opening scans every entry (keys, object types, shapes, byte extents; text parsed in full),
// so that decoding an entry later cannot fail. Files are memory-mapped; a pipe's output is
// read into memory once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/kaldi/kaldi_object.h"
#include "common/mapped_file.h"

namespace conveyor::kaldi {

struct Rspecifier {
  bool scp = false;  // false: ark
  bool once = false, sorted = false, called_sorted = false, permissive = false;
  bool binary = false, text = false, background = false;
  std::string rxfilename;
};
// Parses "ark,s,cs:foo.ark" etc. Errors: InvalidArgument naming what is wrong.
absl::StatusOr<Rspecifier> ParseRspecifier(std::string_view spec);

// A matrix range `[rows]` or `[rows,cols]`, each part `a:b` (inclusive) or `:`; the empty
// rows part of `[,c1:c2]` means all rows (Kaldi's documentation; its code refuses it).
struct MatrixRange {
  bool all_rows = true, all_cols = true;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};
absl::StatusOr<MatrixRange> ParseMatrixRange(std::string_view inside);

// Applies `range` to a rows x cols matrix with Kaldi's checks: 0 <= a <= b; a row end up to
// rows+2 is clamped to rows-1 (`*clamped` set), further is an error; a column end must be < cols.
absl::StatusOr<Window> ApplyRange(const MatrixRange& range, int64_t rows, int64_t cols, bool* clamped);

struct TableEntry {
  std::string key;
  uint32_t source = 0;  // index into the table's sources
  uint64_t offset = 0;  // the object's first byte in that source
  ObjectInfo info;
  Window window;        // rows/cols delivered (the whole matrix unless the scp line had a range)
};

struct TableOptions {
  ObjectKind kind = ObjectKind::kMatrix;
  bool allow_pipes = false;
  // Relative rxfilenames (in the rspecifier, and in scp lines) resolve against this
  // directory; scp lines fall back to the scp file's own directory.
  std::string base_dir;
  // Bad entries: with Kaldi's `p` option, or while this returns true (the dataset's maxErrors
  // budget), an entry that cannot be read is skipped with a warning (an archive stops at
  // it); otherwise opening fails with that error.
  std::function<bool(const std::string& error)> tolerate;
  std::function<void(const std::string& warning)> warn;
  std::function<void(uint64_t done, uint64_t total)> progress;  // bytes of the scanned sources
};

class KaldiTable {
 public:
  // Errors: InvalidArgument (rspecifier, pipes refused), NotFound (files), DataLoss (bad
  // entries beyond what `tolerate` allows), each naming the file and its line or byte offset.
  static absl::StatusOr<std::unique_ptr<KaldiTable>> Open(const std::string& rspecifier, const TableOptions& options);

  // An archive held in memory (fuzzing, tests): `bytes` is copied; `name` names it in messages.
  static absl::StatusOr<std::unique_ptr<KaldiTable>> OpenArchiveBytes(std::string bytes, const std::string& name,
                                                                      const TableOptions& options);

  const std::vector<TableEntry>& entries() const { return entries_; }
  const Rspecifier& spec() const { return spec_; }
  std::string_view bytes(uint32_t source) const { return sources_[source].bytes; }
  const std::string& source_name(uint32_t source) const { return sources_[source].name; }
  // The file a source maps; "" for a pipe's output.
  std::string source_path(uint32_t source) const { return sources_[source].file ? sources_[source].file->path() : ""; }
  size_t num_sources() const { return sources_.size(); }
  // Bytes of all the sources (mapped files and pipe outputs).
  uint64_t total_bytes() const;
  uint64_t skipped() const { return skipped_; }

  // Entry i's window, row-major, into `out` (window.rows * window.cols values).
  template <typename T>
  void Decode(size_t i, T* out) const {
    const TableEntry& e = entries_[i];
    DecodeMatrix<T>(sources_[e.source].bytes, e.offset, e.info, e.window, out);
  }
  void DecodeInts(size_t i, std::vector<int32_t>* out) const {
    const TableEntry& e = entries_[i];
    DecodeInt32Vector(sources_[e.source].bytes, e.offset, e.info, out);
  }
  void WillNeed(size_t i) const;
  // The mapped file of `source`; null for a pipe's output (which cannot change).
  const MappedFile* file(uint32_t source) const { return sources_[source].file.get(); }

 private:
  struct Source {
    std::string name;  // path, or the command of a pipe
    std::unique_ptr<MappedFile> file;
    std::string owned;  // a pipe's output
    std::string_view bytes;
  };
  absl::StatusOr<uint32_t> SourceFor(const std::string& rxfilename, const std::string& scp_dir);
  absl::Status ReadArchive(uint32_t source, const TableOptions& options);
  absl::Status ReadScp(const std::string& path, const TableOptions& options);

  Rspecifier spec_;
  std::vector<Source> sources_;
  std::vector<TableEntry> entries_;
  uint64_t skipped_ = 0;
  bool allow_pipes_ = false;
  std::string base_dir_;
};

}  // namespace conveyor::kaldi
