#include "tests/test_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/batch/dump_writer.h"
#include "common/config/config_loader.h"
#include "common/sampling/loader.h"

namespace conveyor::testing {

std::string TestdataDir() { return CONVEYOR_TESTDATA_DIR; }

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/conveyor_test_XXXXXX");
  char* p = ::mkdtemp(tmpl.data());
  path_ = p ? p : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name, const std::string& contents) const {
  const std::string p = absl::StrCat(path_, "/", name);
  std::ofstream out(p, std::ios::binary);
  out << contents;
  return p;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

DatasetConfig CtfDataset(const std::string& file, const std::string& input_yaml,
                         const std::string& extra_yaml) {
  std::string yaml = "datasets:\n  d:\n";
  if (extra_yaml.find("randomize:") == std::string::npos) yaml += "    randomize: false\n";
  if (!extra_yaml.empty()) absl::StrAppend(&yaml, "    ", extra_yaml, "\n");
  absl::StrAppend(&yaml, "    deserializers:\n      - type: CNTKTextFormat\n        file: ", file,
                  "\n        input: ", input_yaml, "\n");
  auto config = ParseConfig(yaml, "test.yaml", "");
  if (!config.ok()) {
    std::fprintf(stderr, "bad test config: %s\n%s", std::string(config.status().message()).c_str(), yaml.c_str());
    std::abort();
  }
  return config->datasets[0];
}

namespace {

absl::StatusOr<std::unique_ptr<Dataset>> OpenCollecting(const DatasetConfig& config,
                                                        std::vector<std::string>* messages, bool compressed_in_place) {
  DatasetOpenOptions oo;
  oo.compressed_in_place = compressed_in_place;
  oo.diagnostics_sink = [messages](Severity, const std::string& text) {
    if (messages) messages->push_back(text);
  };
  return Dataset::Open(config, oo);
}

absl::StatusOr<ResolvedStream> Resolve(const Dataset& ds, const ReadOptions& options) {
  StreamRequest r = options.request;
  r.minibatch_size = options.minibatch_size;
  r.epochs = options.epochs;
  if (options.epoch_size) r.epoch_size = options.epoch_size;
  r.threads = options.threads;
  return ResolveStream(ds, r);
}

// Opens the dataset and calls `each` with every batch the loader delivers (up to
// options.max_batches_per_epoch per epoch).
absl::Status ForEachBatch(const DatasetConfig& config, const ReadOptions& options,
                          std::vector<std::string>* messages,
                          const std::function<void(const Batch&, const ResolvedStream&)>& each) {
  auto ds = OpenCollecting(config, messages, options.compressed_in_place);
  if (!ds.ok()) return ds.status();
  auto resolved = Resolve(**ds, options);
  if (!resolved.ok()) return resolved.status();
  auto assembler = MakeCpuAssembler();
  auto loader = Loader::Create(ds->get(), assembler.get(), resolved->loader);
  if (!loader.ok()) return loader.status();
  Batch b;
  while (true) {
    auto more = (*loader)->Next(&b);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    if (b.index < options.max_batches_per_epoch) each(b, *resolved);
  }
}

}  // namespace

absl::StatusOr<std::string> DumpDataset(const DatasetConfig& config, const ReadOptions& options,
                                        std::vector<std::string>* messages) {
  std::string out;
  absl::Status st = ForEachBatch(config, options, messages, [&](const Batch& b, const ResolvedStream& r) {
    AppendDump(b.epoch, b.index, b.plan, b.bytes, options.cursors ? r.Encode(b.after) : "", &out);
  });
  if (!st.ok()) return st;
  return out;
}

namespace {

template <typename T>
T At(const std::byte* base, uint64_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof(T));
  return v;
}

// Appends one sample of stream L (sequence n, step t) as `dim` dense values, %g-formatted.
template <typename T>
void AppendSample(const StreamLayout& L, uint64_t n, uint64_t t, const std::byte* base,
                  std::vector<std::string>* out) {
  std::vector<double> row(L.dim, 0.0);
  const uint64_t T_len = L.sequence_axis ? L.max_length : 1;
  if (L.format == StreamFormat::kDense) {
    for (uint32_t j = 0; j < L.dim; ++j)
      row[j] = At<T>(base, L.values.offset + ((n * T_len + t) * L.dim + j) * sizeof(T));
  } else {
    const uint64_t col = n * T_len + t;
    auto ptr = [&](uint64_t c) -> int64_t {
      return L.colptr.dtype == DType::kInt64 ? At<int64_t>(base, L.colptr.offset + c * 8)
                                             : At<int32_t>(base, L.colptr.offset + c * 4);
    };
    for (int64_t k = ptr(col); k < ptr(col + 1); ++k)
      row[At<int32_t>(base, L.rowind.offset + k * 4)] += At<T>(base, L.values.offset + k * sizeof(T));
  }
  for (double v : row) out->push_back(absl::StrFormat("%g", static_cast<T>(v)));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CntkControlTokens(const DatasetConfig& config,
                                                           const ReadOptions& options) {
  std::vector<std::string> out;
  absl::Status st = ForEachBatch(config, options, nullptr, [&](const Batch& b, const ResolvedStream&) {
    for (size_t si = 0; si < b.plan.streams.size(); ++si) {
      const StreamLayout& L = b.plan.streams[si];
      // CNTK's MBLayout: sequences first-fit into rows of width T (the longest sequence);
      // columns are printed time-major, gaps skipped.
      const uint64_t n_rows = b.plan.shape.rows;
      std::vector<uint64_t> len(n_rows, 1);
      if (L.lengths.present())
        for (uint64_t n = 0; n < n_rows; ++n)
          len[n] = static_cast<uint64_t>(At<int32_t>(b.bytes.data(), L.lengths.offset + n * 4));
      uint64_t width = 0;
      for (uint64_t l : len) width = std::max(width, l);
      struct Placed { uint64_t seq, start; };
      std::vector<std::vector<Placed>> rows;
      std::vector<uint64_t> used;
      for (uint64_t n = 0; n < len.size(); ++n) {
        if (len[n] == 0) continue;
        size_t r = 0;
        while (r < rows.size() && used[r] + len[n] > width) ++r;
        if (r == rows.size()) {
          rows.emplace_back();
          used.push_back(0);
        }
        rows[r].push_back({n, used[r]});
        used[r] += len[n];
      }
      for (uint64_t t = 0; t < width; ++t) {
        for (size_t r = 0; r < rows.size(); ++r) {
          for (const Placed& p : rows[r]) {
            if (t >= p.start && t < p.start + len[p.seq]) {
              if (b.plan.precision == Precision::kFloat) AppendSample<float>(L, p.seq, t - p.start, b.bytes.data(), &out);
              else AppendSample<double>(L, p.seq, t - p.start, b.bytes.data(), &out);
            }
          }
        }
      }
    }
  });
  if (!st.ok()) return st;
  return out;
}

std::vector<std::string> Tokens(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) out.push_back(tok);
  return out;
}

absl::Status ParseTheLastChunkOfAFileCutShort(const DatasetConfig& config, uint64_t keep, ChunkEntry* last) {
  auto ds = Dataset::Open(config);
  if (!ds.ok()) return absl::InternalError(absl::StrCat("open: ", ds.status().ToString()));
  const Index& index = (*ds)->index();
  if (config.deserializers.size() != 1 || index.chunks.size() < 2) {
    return absl::InternalError(absl::StrCat("expected one file of two or more chunks, have ", index.chunks.size()));
  }
  *last = index.chunks.back();
  const std::string& path = config.deserializers[0].file;
  if (::truncate(path.c_str(), static_cast<off_t>(last->begin_offset + keep)) != 0) {
    return absl::InternalError(absl::StrCat("truncate ", path, ": ", std::strerror(errno)));
  }
  // Chunk 0 lies before the cut, but the file is no longer the one indexed: refused too.
  auto first = (*ds)->ParseChunk(0);
  if (first.ok() || first.status().message().find("changed after it was opened") == std::string::npos) {
    return absl::InternalError(absl::StrCat("chunk 0, before the cut: ", first.status().ToString()));
  }
  return (*ds)->ParseChunk(index.chunks.size() - 1).status();
}

absl::Status RewriteInPlace(const std::string& path, const std::string& bytes, int seconds) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  FILE* w = std::fopen(path.c_str(), "r+b");
  if (w == nullptr) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), w) == bytes.size();
  if (std::fclose(w) != 0 || !written) return absl::InternalError(absl::StrCat("rewriting ", path, " in place"));
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  times[1].tv_sec += seconds;
  if (::utimensat(AT_FDCWD, path.c_str(), times, 0) != 0) {
    return absl::InternalError(absl::StrCat("utimensat ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

CommandRun RunCommand(const std::string& command) {
  CommandRun r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace conveyor::testing
