// mapped_file.h: a read-only memory mapping of a whole file.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

// Identity of a file's contents as far as caches are concerned.
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // MappedFile::SampleHash() where a cache keeps it (the index cache); 0 where not asked.
  uint64_t sample_hash = 0;
  bool operator==(const FileStamp& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && sample_hash == o.sample_hash;
  }
};

// Returns the size and modification time of `path`; NotFound / PermissionDenied otherwise.
absl::StatusOr<FileStamp> StatFile(const std::string& path);

// The whole contents of a (small) file: configurations, certificates, tokens.
// Errors: NotFound, PermissionDenied, Internal, each naming the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// A read-only, private mapping of a file. Movable, not copyable; unmaps on destruction.
// The bytes stay valid for the lifetime of the object. Thread-safe for concurrent reads.
class MappedFile {
 public:
  // Maps `path`. Errors: NotFound, PermissionDenied, InvalidArgument (a directory), Internal.
  // An empty file maps to an empty view. With `readable`, the file stays open for Read().
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path, bool readable = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  const FileStamp& stamp() const { return stamp_; }

  // Tells the kernel the range [offset, offset+length) will be read soon (readahead). With
  // `populate` (a whole chunk read right after this), maps it in one call where the kernel
  // can (MADV_POPULATE_READ) instead of a page fault every few pages.
  void WillNeed(uint64_t offset, uint64_t length, bool populate = false) const;
  // Drops the range's pages from this mapping (they stay in the page cache): after a chunk
  // is parsed its text is not needed, and the process's RSS stays bounded by the window.
  void DontNeed(uint64_t offset, uint64_t length) const;

  // Copies [offset, offset+length) of the file into `out` with pread(2), not through the
  // mapping: the kernel copies from the page cache through its own mapping of memory, and
  // this process's page tables are not touched. A chunk read this way costs one copy, where
  // reading it through the mapping costs a page-table entry per 4 KiB page made and dropped
  // again per read (on the virtual machines of bench/RESULTS.md, "Chunks read, not mapped",
  // a first touch of each mapped page costs about 2 us: 3-4x the copy). Errors:
  // FailedPrecondition (not opened `readable`), DataLoss when the file now ends before the
  // range does (it was changed after it was opened: no SIGBUS as through the mapping),
  // Internal for an I/O error; each names the path and the range. DataLoss too when the file's
  // size or mtime is no longer what it was when opened (rewritten in place: the bytes read may
  // be the new file's). Thread-safe.
  absl::Status Read(uint64_t offset, uint64_t length, char* out) const;

  // OK unless the file at path() is still the one opened (the same inode) and its size or
  // mtime changed since: rewritten or cut in place, so that what its mapping reads may be the
  // new file's, which the index made at open does not describe. Then DataLoss naming the file,
  // both stamps and what to do. A file renamed over the path (the way to replace one) or
  // deleted is no change: the mapping still reads the file opened (a file moved away and then
  // rewritten is not seen: the path names another file or none). A new mtime over the same
  // sampled bytes (`touch`) or bytes appended after those opened is no change either (the
  // first check samples the file: SampleHash). One stat(2); Read() checks the same way.
  absl::Status CheckUnchanged() const;
  // CheckUnchanged() of at most `max_checks` of `files` (sorted and made unique here; nulls,
  // for inputs that are no file, skipped), spread over them and moved along by `rotation` at
  // each call: a chunk that reads thousands of small files checks a few each parse, since a
  // stat costs about what decoding a small file does.
  static absl::Status CheckSomeUnchanged(std::vector<const MappedFile*>* files, std::atomic<uint64_t>* rotation,
                                         size_t max_checks = 8);

  // A hash of the file's size and of 16 pieces of 4 KiB spread over it (all of a file of 64
  // KiB or less): what an index cache keeps beside the size and mtime, so that a file
  // rewritten with its size and mtime kept (`touch -r`, `cp --preserve`, rewritten within one
  // tick of the kernel's clock) is not read with the old file's index. Reads the mapping.
  uint64_t SampleHash() const;

  // A file cut short after it was mapped (rewritten in place, truncated) would make a read of
  // its mapping past the new end raise SIGBUS and kill the process. Instead, the first Open()
  // installs a handler that gives the faulting page zeros (an anonymous page mapped over it)
  // and counts the fault, so the read goes on; whoever turns mapped bytes into output then
  // asks CheckReads() and fails instead of serving those zeros (Dataset does after every
  // parse and every batch). A SIGBUS that is not a read past a file's end (BUS_ADRERR) keeps
  // its default action.
  //
  // Reads past a file's end so far, in this process (0 on every path but this one).
  static uint64_t CutShortReads();
  // OK unless a mapping of one of `paths` was read past its file's end (now or earlier: a page
  // given zeros is not read from the file again, so the mapping stays marked): then DataLoss
  // naming the file, the offset read and the size it had when opened. Reads the faults the
  // handler recorded; where more came than it keeps, compares each file's size now instead.
  static absl::Status CheckReads(const std::vector<std::string>& paths);

 private:
  MappedFile(std::string path, const char* data, size_t size, FileStamp stamp, int fd, uint64_t dev, uint64_t ino)
      : path_(std::move(path)), data_(data), size_(size), stamp_(stamp), fd_(fd), dev_(dev), ino_(ino) {}
  // The message of a file changed since it was opened (its size and mtime now).
  absl::Status ChangedError(const FileStamp& now) const;
  // OK when `now` is the accepted stamp, or a touch or an append of the file opened.
  absl::Status Verify(const FileStamp& now) const;
  friend struct MappingRegistry;
  const std::string path_;
  const char* const data_;
  const size_t size_;
  const FileStamp stamp_;
  const int fd_;  // -1 unless opened `readable`
  const uint64_t dev_, ino_;  // which file was opened (a path may name another one later)
  // The first offset read past the file's end (UINT64_MAX: none), under the registry's lock.
  uint64_t cut_at_ = UINT64_MAX;
  size_t range_slot_ = SIZE_MAX;  // its range in the SIGBUS handler's table (SIZE_MAX: none)
  // Verify(): the stamp compared with (the one at open, then one a touch or append set) and
  // the sample hash of the bytes opened, taken at the first check.
  mutable std::mutex verify_mu_;
  mutable FileStamp accepted_{stamp_};
  mutable uint64_t opened_sample_ = 0;
  mutable bool sampled_ = false;
};

}  // namespace conveyor
