#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

FileStamp StampOf(const struct stat& st) {
  FileStamp s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  return s;
}

}  // namespace

absl::StatusOr<FileStamp> StatFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  return StampOf(st);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path, bool readable) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a data file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const char* data = "";
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot mmap", path);
    }
    data = static_cast<const char*>(p);
  }
  if (!readable) {
    ::close(fd);  // The mapping keeps the file referenced.
    fd = -1;
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size, StampOf(st), fd));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status MappedFile::Read(uint64_t offset, uint64_t length, char* out) const {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": not opened for reading"));
  uint64_t done = 0;
  while (done < length) {
    const uint64_t want = std::min<uint64_t>(length - done, uint64_t{1} << 30);
    const ssize_t n = ::pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cannot read bytes ", offset, "-", offset + length), path_);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path_, ": the file ends at byte ", offset + done, ", before byte ",
                                              offset + length, " which its index needs (it was ", size_,
                                              " bytes when opened: was it changed or truncated since?)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

void MappedFile::WillNeed(uint64_t offset, uint64_t length, bool populate) const {
  if (size_ == 0 || offset >= size_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;
  const uint64_t end = std::min<uint64_t>(size_, offset + length);
  // MADV_POPULATE_READ: Linux 5.14; older kernels refuse it and get readahead.
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  if (!populate || ::madvise(const_cast<char*>(data_) + begin, end - begin, MADV_POPULATE_READ) != 0) {
    ::madvise(const_cast<char*>(data_) + begin, end - begin, MADV_WILLNEED);
  }
}

void MappedFile::DontNeed(uint64_t offset, uint64_t length) const {
  if (size_ == 0 || offset >= size_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages inside the range only: a neighbouring chunk may share the edge pages.
  const uint64_t begin = (offset + page - 1) / page * page;
  const uint64_t end = std::min<uint64_t>(size_, offset + length) / page * page;
  if (end > begin) ::madvise(const_cast<char*>(data_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace conveyor
