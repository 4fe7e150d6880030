#include "common/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/status_macros.h"

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

// "2026-11-29 21:58:13.123456789 UTC" (what a person compares with `ls --full-time`).
std::string FormatMtime(int64_t ns) {
  // Floor division: 1969-12-31 23:59:59.25 is -750000000 ns, second -1 and 250000000 ns after it.
  int64_t whole = ns / 1000000000LL, frac = ns % 1000000000LL;
  if (frac < 0) {
    frac += 1000000000LL;
    --whole;
  }
  const time_t sec = static_cast<time_t>(whole);
  struct tm tm;
  char buf[64];
  if (::gmtime_r(&sec, &tm) == nullptr || std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm) == 0) {
    return absl::StrCat(ns, " ns");
  }
  return absl::StrFormat("%s.%09d UTC", buf, static_cast<int>(frac));
}

FileStamp StampOf(const struct stat& st) {
  FileStamp s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  return s;
}

// The faults the SIGBUS handler repaired: a count, and the addresses of the last kFaultRing
// (written by the handler, which may take no lock; read under the registry's lock).
constexpr size_t kFaultRing = 4096;
std::atomic<uint64_t> g_reserved{0};  // slots taken by handlers
std::atomic<uint64_t> g_faults{0};    // slots written: every one below it holds its address
std::array<std::atomic<uintptr_t>, kFaultRing> g_fault_addresses{};
struct sigaction g_previous_sigbus;

// The ranges of live file mappings, for the handler, which may take no lock: [begin, end)
// pairs in slots below g_ranges_used, a free slot's begin 0. Written under the registry's
// lock (end before begin, begin cleared first); about one slot a mapping, and a process
// cannot hold many more mappings than this (vm.max_map_count, 65530 by default). A mapping
// that finds no slot is read unguarded, as before this handler.
constexpr size_t kRangeSlots = size_t{1} << 16;
struct RangeSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
};
RangeSlot g_ranges[kRangeSlots];
std::atomic<size_t> g_ranges_used{0};

// Whether `addr` lies in a live file mapping (MappedFile): a fault elsewhere (a device's
// mapping, a segment of shared memory) is not this handler's to hide.
bool InFileMapping(uintptr_t addr) {
  const size_t used = g_ranges_used.load(std::memory_order_acquire);
  for (size_t i = 0; i < used; ++i) {
    const uintptr_t b = g_ranges[i].begin.load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < g_ranges[i].end.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (info != nullptr && info->si_code == BUS_ADRERR && InFileMapping(reinterpret_cast<uintptr_t>(info->si_addr))) {
    // A read of a mapping past the end of its file: zeros for that page (the read goes on and
    // the fault is counted, for CheckReads()). mmap is a plain system call here.
    const long page = ::sysconf(_SC_PAGESIZE);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    void* at = reinterpret_cast<void*>(addr / static_cast<uintptr_t>(page) * static_cast<uintptr_t>(page));
    if (::mmap(at, static_cast<size_t>(page), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
      // A slot of its own (two threads may fault at once), published in order: a reader that
      // sees the count also sees every address below it.
      const uint64_t k = g_reserved.fetch_add(1, std::memory_order_relaxed);
      g_fault_addresses[k % kFaultRing].store(addr, std::memory_order_relaxed);
      uint64_t expected = k;
      while (!g_faults.compare_exchange_weak(expected, k + 1, std::memory_order_release, std::memory_order_relaxed)) {
        expected = k;  // an earlier slot's handler has not published yet
      }
      return;
    }
  }
  // Anything else: what it did before (by default, end the process with the signal).
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction != nullptr) {
      g_previous_sigbus.sa_sigaction(sig, info, context);
      return;
    }
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  // The default action: raised again (delivered when this returns: SIGBUS is blocked in its
  // handler), so that one sent with kill(2) ends the process too rather than being lost.
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

}  // namespace

// Every live mapping by its first byte, for finding the file of a fault's address.
struct MappingRegistry {
  std::mutex mu;
  std::map<uintptr_t, MappedFile*> by_address;  // guarded by mu
  std::vector<size_t> free_slots;                // below g_ranges_used; guarded by mu
  uint64_t faults_read = 0;                      // faults already attributed; guarded by mu

  void Add(MappedFile* f, uintptr_t begin, size_t size) {
    Attribute();  // faults so far belong to the mappings before this one
    by_address[begin] = f;
    size_t slot = kRangeSlots;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else if (g_ranges_used.load(std::memory_order_relaxed) < kRangeSlots) {
      slot = g_ranges_used.load(std::memory_order_relaxed);
    }
    if (slot == kRangeSlots) return;  // no slot: read unguarded
    g_ranges[slot].end.store(begin + size, std::memory_order_relaxed);
    g_ranges[slot].begin.store(begin, std::memory_order_release);
    if (slot == g_ranges_used.load(std::memory_order_relaxed)) g_ranges_used.store(slot + 1, std::memory_order_release);
    f->range_slot_ = slot;
  }
  void Remove(MappedFile* f, uintptr_t begin) {
    Attribute();  // a fault in this mapping is not to be given to the next one at its address
    by_address.erase(begin);
    if (f->range_slot_ == SIZE_MAX) return;
    g_ranges[f->range_slot_].begin.store(0, std::memory_order_release);
    g_ranges[f->range_slot_].end.store(0, std::memory_order_relaxed);
    free_slots.push_back(f->range_slot_);
  }

  static MappingRegistry& Get() {
    static MappingRegistry* r = new MappingRegistry;  // never destroyed: mappings outlive statics
    return *r;
  }
  // Attributes the faults recorded since the last call to their mappings (cut_at_); where the
  // ring lost some, compares every mapping's file size now instead. Under mu.
  void Attribute() {
    const uint64_t n = g_faults.load(std::memory_order_acquire);
    if (n == faults_read) return;
    if (n - faults_read > kFaultRing) {  // the ring lost some: every file's size now, too
      for (auto& [begin, f] : by_address) {
        struct stat st;
        if (::stat(f->path_.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) < f->size_) {
          f->cut_at_ = std::min<uint64_t>(f->cut_at_, static_cast<uint64_t>(st.st_size));
        }
      }
    }
    {
      for (uint64_t k = n - std::min<uint64_t>(n - faults_read, kFaultRing); k < n; ++k) {
        const uintptr_t addr = g_fault_addresses[k % kFaultRing].load(std::memory_order_relaxed);
        auto it = by_address.upper_bound(addr);
        if (it == by_address.begin()) continue;
        --it;
        MappedFile* f = it->second;
        if (addr < it->first + f->size_) f->cut_at_ = std::min<uint64_t>(f->cut_at_, addr - it->first);
      }
    }
    faults_read = n;
  }
};

uint64_t MappedFile::CutShortReads() { return g_faults.load(std::memory_order_acquire); }

absl::Status MappedFile::CheckReads(const std::vector<std::string>& paths) {
  if (CutShortReads() == 0) return absl::OkStatus();
  MappingRegistry& r = MappingRegistry::Get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.Attribute();
  const std::unordered_set<std::string> wanted(paths.begin(), paths.end());
  for (const auto& [begin, f] : r.by_address) {
    if (f->cut_at_ == UINT64_MAX || wanted.count(f->path_) == 0) continue;
    return absl::DataLossError(absl::StrCat(f->path_, ": the file was cut short after it was opened: a read at byte ",
                                            f->cut_at_, " found no data (it was ", f->size_,
                                            " bytes when opened: was it changed or truncated since?)"));
  }
  return absl::OkStatus();
}

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
  // O_NONBLOCK: opening a FIFO would wait for a writer (it is refused below); no effect on
  // reads of a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == EWOULDBLOCK) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a lease: wait for it
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    // A device or a FIFO has no size to map (/dev/zero would read as an empty dataset, a FIFO
    // would wait forever): data is read from files (a Kaldi `cmd |` pipe for a stream).
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", what, ", expected a data file (a regular file)"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // (kept for Read(): blocking reads)
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
  std::unique_ptr<MappedFile> f(new MappedFile(path, data, size, StampOf(st), fd, static_cast<uint64_t>(st.st_dev),
                                               static_cast<uint64_t>(st.st_ino)));
  if (size > 0) {
    InstallSigbusHandler();
    MappingRegistry& r = MappingRegistry::Get();
    std::lock_guard<std::mutex> lock(r.mu);
    r.Add(f.get(), reinterpret_cast<uintptr_t>(data), size);
  }
  return f;
}

MappedFile::~MappedFile() {
  if (size_ > 0) {
    MappingRegistry& r = MappingRegistry::Get();
    std::lock_guard<std::mutex> lock(r.mu);
    r.Remove(this, reinterpret_cast<uintptr_t>(data_));
  }
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
      // Where it ends now (the read stopped at offset + done, which may lie past that).
      struct stat st;
      const uint64_t end = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : offset + done;
      return absl::DataLossError(absl::StrCat(path_, ": the file ends at byte ", end, ", before byte ",
                                              offset + length, " which its index needs (it was ", size_,
                                              " bytes when opened: was it changed or truncated since?)"));
    }
    done += static_cast<uint64_t>(n);
  }
  // Rewritten in place since it was opened (same size or not): the bytes just read may be the
  // new file's, which the index made at open does not describe. A write (write(2) on a local
  // file system) updates the mtime before it copies its bytes, so a read that saw any new byte
  // sees the new mtime here.
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, "cannot stat", path_);
  return Verify(StampOf(st));
}

absl::Status MappedFile::Verify(const FileStamp& now) const {
  auto stat_now = [this](FileStamp* out) {
    struct stat st;
    if (fd_ >= 0 ? ::fstat(fd_, &st) != 0 : ::stat(path_.c_str(), &st) != 0) return false;
    *out = StampOf(st);
    return true;
  };
  std::lock_guard<std::mutex> lock(verify_mu_);
  if (now.size == accepted_.size && now.mtime_ns == accepted_.mtime_ns) {
    if (!sampled_) {
      // What a touch or an append is told apart by later: the sampled pieces as opened. Hashed
      // first, then the stamp seen unchanged: no write had begun before the hash (a write
      // updates the mtime first), so the hash is of the bytes the index describes.
      const uint64_t h = SampleHash();
      FileStamp again;
      if (stat_now(&again) && again.size == accepted_.size && again.mtime_ns == accepted_.mtime_ns) {
        opened_sample_ = h;
        sampled_ = true;
      }
    }
    return absl::OkStatus();
  }
  // A new mtime over the same bytes (`touch`, a copy tool setting times), or bytes appended
  // after those indexed: the pieces sampled from what was indexed are unchanged. From then on
  // that stamp is the one compared with. Anything shorter, or other sampled bytes: changed.
  if (sampled_ && now.size >= stamp_.size && SampleHash() == opened_sample_) {
    accepted_ = now;
    return absl::OkStatus();
  }
  return ChangedError(now);
}

absl::Status MappedFile::ChangedError(const FileStamp& now) const {
  return absl::DataLossError(absl::StrCat(
      path_, ": the file was changed after it was opened (", stamp_.size, " bytes, modified ",
      FormatMtime(stamp_.mtime_ns), "; now ", now.size, " bytes, modified ", FormatMtime(now.mtime_ns),
      "): its index no longer describes it. Open it again to index it again (restart the command or "
      "conveyord), and replace a data file by renaming a new one over it, not by rewriting it in place"));
}

absl::Status MappedFile::CheckUnchanged() const {
  struct stat st;
  if (fd_ >= 0 ? ::fstat(fd_, &st) != 0 : ::stat(path_.c_str(), &st) != 0) {
    // Deleted (or its directory made unreadable): the mapping keeps the file opened.
    return absl::OkStatus();
  }
  if (static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_) {
    return absl::OkStatus();  // another file renamed over the path: the mapping keeps ours
  }
  return Verify(StampOf(st));
}

absl::Status MappedFile::CheckSomeUnchanged(std::vector<const MappedFile*>* files, std::atomic<uint64_t>* rotation,
                                            size_t max_checks) {
  std::sort(files->begin(), files->end());
  files->erase(std::unique(files->begin(), files->end()), files->end());
  const size_t n = files->size();
  const size_t checks = std::min(n, max_checks);
  const size_t start = n > max_checks ? static_cast<size_t>(rotation->fetch_add(1, std::memory_order_relaxed) % n) : 0;
  for (size_t k = 0; k < checks; ++k) {
    const MappedFile* f = (*files)[(start + k * n / checks) % n];
    if (f != nullptr) RETURN_IF_ERROR(f->CheckUnchanged());
  }
  return absl::OkStatus();
}

uint64_t MappedFile::SampleHash() const {
  // Up to kSamples pieces of kPiece bytes, the first at the start, the last at the end and the
  // rest evenly between (a small file: all of it). Read through the mapping: a page fault
  // each, a few microseconds in all.
  constexpr uint64_t kSamples = 16, kPiece = 4096;
  uint64_t h = Mix64(0x5a3c9e1fd4b27a61ull, size_);
  if (size_ <= kSamples * kPiece) return Hash64(data_, size_, h);
  for (uint64_t i = 0; i < kSamples; ++i) {
    const uint64_t at = (size_ - kPiece) / (kSamples - 1) * i;
    h = Hash64(data_ + (i + 1 == kSamples ? size_ - kPiece : at), kPiece, h);
  }
  return h;
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
