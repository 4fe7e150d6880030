// index_scale_bench: index memory and open-from-cache time against dataset size (issue 19).
//
//   yes '|y 1' | head -n 100000000 > /tmp/h9/s1e8.ctf     # 10^8 one-line sequences, 500 MB
//   build/bench/index_scale_bench /tmp/h9/s1e8.ctf [rounds]
//
// On one CTF file: builds the index (the real indexer, all cores), writes the .cvyidx cache
// next to a copy of the path (FILE.bench.cvyidx, deleted at the end), then reads it back
// `rounds` times (page cache warm after the write) and times each phase of what
// CtfDeserializer does on a cached open: ReadIndexCache (map, block checksums, record checks) and
// BuildChunks; CPU is the process's (user + system, all threads). Memory: the index's own
// accounting (vector capacities, or the borrowed records: "records_in_place") and the RSS delta of
// holding one loaded index. Prints one line of JSON. Not a test: nothing is asserted.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/formats/ctf/ctf_indexer.h"
#include "common/index/index.h"
#include "common/index/index_cache.h"
#include "common/mapped_file.h"

namespace {

using Clock = std::chrono::steady_clock;
double Secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Resident set size in bytes (/proc/self/statm, second field).
uint64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t IndexBytes(const conveyor::Index& index) {
  uint64_t b = index.sequences.capacity() * sizeof(conveyor::SequenceEntry) +
               index.chunks.capacity() * sizeof(conveyor::ChunkEntry) +
               index.names.capacity() * sizeof(std::string) +
               index.errors.first.capacity() * sizeof(conveyor::IndexError);
  for (const std::string& n : index.names) b += n.capacity() > 15 ? n.capacity() + 1 : 0;
  return b;
}

// CPU time of the process, user + system, all threads (ReadIndexCache checks the records on
// several): on a loaded machine, closer to the open's own cost than wall time.
double ProcessCpuSecs() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE.ctf [rounds]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  constexpr uint64_t kChunk = 32ull << 20;

  auto file = conveyor::MappedFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  conveyor::CtfIndexOptions io;
  io.chunk_size = kChunk;
  const uint64_t config_hash = conveyor::CtfIndexConfigHash(io);
  const std::string cache = path + ".bench.cvyidx";

  uint64_t n = 0, built_bytes = 0;
  double build_s = 0, hash_s = 0, write_s = 0;
  {
    const auto t0 = Clock::now();
    auto built = conveyor::BuildCtfIndex((*file)->bytes(), path, io);
    const auto t1 = Clock::now();
    if (!built.ok()) {
      std::fprintf(stderr, "%s\n", std::string(built.status().message()).c_str());
      return 1;
    }
    built->ComputeContentHash();
    const auto t2 = Clock::now();
    auto w = conveyor::WriteIndexCache(cache, *built, (*file)->stamp(), config_hash);
    const auto t3 = Clock::now();
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", std::string(w.message()).c_str());
      return 1;
    }
    build_s = Secs(t0, t1);
    hash_s = Secs(t1, t2);
    write_s = Secs(t2, t3);
    n = built->sequences.size();
    built_bytes = IndexBytes(*built);
  }
  uint64_t cache_size = 0;
  {
    std::ifstream c(cache, std::ios::binary | std::ios::ate);
    cache_size = static_cast<uint64_t>(c.tellg());
  }

  std::vector<double> read_s, chunks_s, total_s, cpu_s;
  uint64_t loaded_bytes = 0, rss_delta = 0;
  bool borrowed = false;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t rss0 = RssBytes();
    const double c0 = ProcessCpuSecs();
    const auto t0 = Clock::now();
    auto cached = conveyor::ReadIndexCache(cache, (*file)->stamp(), config_hash);
    const auto t1 = Clock::now();
    if (!cached.ok() || !cached->has_value()) {
      std::fprintf(stderr, "cache not loaded: %s\n",
                   cached.ok() ? "missing" : std::string(cached.status().message()).c_str());
      return 1;
    }
    conveyor::Index index = std::move(**cached);
    index.BuildChunks(kChunk);
    const auto t2 = Clock::now();
    cpu_s.push_back(ProcessCpuSecs() - c0);
    read_s.push_back(Secs(t0, t1));
    chunks_s.push_back(Secs(t1, t2));
    total_s.push_back(Secs(t0, t2));
    loaded_bytes = IndexBytes(index);
    borrowed = index.sequences.borrowed();
    rss_delta = RssBytes() - rss0;
  }
  std::remove(cache.c_str());

  std::printf(
      "{\"file\":\"%s\",\"file_bytes\":%llu,\"sequences\":%llu,\"build_s\":%.3f,\"hash_s\":%.3f,"
      "\"write_cache_s\":%.3f,\"cache_bytes\":%llu,\"built_index_bytes\":%llu,\"open_read_cache_s\":%.3f,"
      "\"open_build_chunks_s\":%.3f,\"open_total_s\":%.3f,\"open_total_min_s\":%.3f,\"open_cpu_s\":%.3f,\"open_cpu_min_s\":%.3f,"
      "\"loaded_index_bytes\":%llu,\"records_in_place\":%s,\"bytes_per_sequence\":%.2f,\"rss_delta_bytes\":%llu}\n",
      path.c_str(), static_cast<unsigned long long>((*file)->bytes().size()),
      static_cast<unsigned long long>(n), build_s, hash_s, write_s,
      static_cast<unsigned long long>(cache_size), static_cast<unsigned long long>(built_bytes),
      Median(read_s), Median(chunks_s), Median(total_s),
      *std::min_element(total_s.begin(), total_s.end()), Median(cpu_s),
      *std::min_element(cpu_s.begin(), cpu_s.end()), static_cast<unsigned long long>(loaded_bytes),
      borrowed ? "true" : "false",
      n ? static_cast<double>(loaded_bytes) / static_cast<double>(n) : 0.0,
      static_cast<unsigned long long>(rss_delta));
  return 0;
}
