#include "common/convert/cbf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_reader.h"

namespace conveyor {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

class Output {
 public:
  explicit Output(std::string path) : path_(std::move(path)) {}
  // Not finished (an error on the way, the input changed under it): the partial file goes.
  ~Output() {
    if (f_ != nullptr) std::fclose(f_);
    if (opened_ && !finished_) std::remove((path_ + ".tmp").c_str());
  }
  absl::Status Open() {
    f_ = std::fopen((path_ + ".tmp").c_str(), "wb");
    if (f_ == nullptr) return Error("cannot create");
    opened_ = true;
    return absl::OkStatus();
  }
  absl::Status Write(const std::string& bytes) {
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) return Error("cannot write");
    written_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status Finish() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return Error("cannot write");
    if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) return Error("cannot rename the finished file to");
    finished_ = true;
    return absl::OkStatus();
  }
  uint64_t written() const { return written_; }

 private:
  absl::Status Error(const char* what) const {
    return absl::UnavailableError(absl::StrCat(path_, ".tmp: ", what, ": ", std::strerror(errno)));
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t written_ = 0;
  bool opened_ = false, finished_ = false;
};

template <typename T>
absl::StatusOr<CbfWriteStats> Write(const Dataset& dataset, const std::string& path, const CbfWriteOptions& options) {
  const std::vector<StreamConfig>& streams = dataset.streams();
  Output out(path);
  if (absl::Status st = out.Open(); !st.ok()) return st;
  std::string head;
  Put<uint64_t>(&head, kCbfMagic);
  Put<uint32_t>(&head, 1);
  if (absl::Status st = out.Write(head); !st.ok()) return st;

  struct ChunkRow {
    uint64_t offset;
    uint32_t sequences, samples;
  };
  std::vector<ChunkRow> table;
  std::vector<uint32_t> lengths;              // current chunk: seqLen per sequence
  std::vector<std::string> data(streams.size());  // current chunk: per stream
  uint64_t pending = 0, samples = 0;
  CbfWriteStats stats;
  auto flush = [&]() -> absl::Status {
    if (lengths.empty()) return absl::OkStatus();
    std::string chunk;
    for (uint32_t n : lengths) Put<uint32_t>(&chunk, n);
    for (auto& d : data) chunk += d;
    table.push_back({out.written(), static_cast<uint32_t>(lengths.size()), static_cast<uint32_t>(samples)});
    if (absl::Status st = out.Write(chunk); !st.ok()) return st;
    lengths.clear();
    for (auto& d : data) d.clear();
    pending = samples = 0;
    return absl::OkStatus();
  };
  std::vector<uint32_t> order;
  const uint64_t n_chunks = dataset.index().chunks.size();
  for (uint64_t c = 0; c < n_chunks; ++c) {
    auto parsed = dataset.ParseChunk(c);
    if (!parsed.ok()) return parsed.status();
    const ParsedChunk& pc = **parsed;
    for (size_t slot = 0; slot < pc.num_sequences(); ++slot) {
      // One sequence, stream by stream.
      std::vector<std::string> rec(streams.size());
      uint32_t longest = 0;
      for (size_t s = 0; s < streams.size(); ++s) {
        const ParsedStream& ps = pc.streams[s];
        const uint64_t b = ps.sequence_begin[slot], e = ps.sequence_begin[slot + 1];
        const uint32_t n = static_cast<uint32_t>(e - b);
        longest = std::max(longest, n);
        std::string& r = rec[s];
        Put<uint32_t>(&r, n);
        if (ps.format == StreamFormat::kDense) {
          if (ps.compressed.empty()) {
            r.append(reinterpret_cast<const char*>(ps.DenseSamples(static_cast<uint32_t>(slot), b, sizeof(T))),
                     (e - b) * ps.dim * sizeof(T));
          } else {  // a Kaldi compressed matrix, decoded
            std::vector<T> decoded((e - b) * ps.dim);
            if (e > b) ps.DecodeDense<T>(static_cast<uint32_t>(slot), b, e - b, decoded.data());
            r.append(reinterpret_cast<const char*>(decoded.data()), decoded.size() * sizeof(T));
          }
          continue;
        }
        const uint64_t nb = ps.nnz_begin[b], ne = ps.nnz_begin[e];
        const auto sl = static_cast<uint32_t>(slot);  // entries in the chunk or where they lie (CBF)
        Put<int32_t>(&r, static_cast<int32_t>(ne - nb));
        // Entries by ascending index within each sample (stable: equal indices keep file order).
        order.resize(ne - nb);
        std::iota(order.begin(), order.end(), 0u);
        for (uint64_t t = b; t < e; ++t) {
          std::stable_sort(order.begin() + (ps.nnz_begin[t] - nb), order.begin() + (ps.nnz_begin[t + 1] - nb),
                           [&](uint32_t x, uint32_t y) { return ps.SparseIndex(sl, nb + x) < ps.SparseIndex(sl, nb + y); });
        }
        for (uint32_t k : order) Put<T>(&r, ps.template SparseValue<T>(sl, nb + k));
        for (uint32_t k : order) Put<int32_t>(&r, ps.SparseIndex(sl, nb + k));
        for (uint64_t t = b; t < e; ++t) Put<int32_t>(&r, static_cast<int32_t>(ps.nnz_begin[t + 1] - ps.nnz_begin[t]));
      }
      uint64_t bytes = 4;
      for (const auto& r : rec) bytes += r.size();
      if (!lengths.empty() && pending + bytes > options.chunk_size) {
        if (absl::Status st = flush(); !st.ok()) return st;
      }
      for (size_t s = 0; s < streams.size(); ++s) data[s] += rec[s];
      lengths.push_back(longest);
      pending += bytes;
      samples += longest;
      ++stats.sequences;
      stats.samples += longest;
    }
    if (options.progress) options.progress(c + 1, n_chunks);
  }
  if (absl::Status st = flush(); !st.ok()) return st;
  std::string header;
  const uint64_t header_offset = out.written();
  Put<uint64_t>(&header, kCbfMagic);
  Put<uint32_t>(&header, static_cast<uint32_t>(table.size()));
  Put<uint32_t>(&header, static_cast<uint32_t>(streams.size()));
  for (const StreamConfig& s : streams) {
    Put<uint8_t>(&header, s.format == StreamFormat::kSparse ? 1 : 0);
    Put<uint32_t>(&header, static_cast<uint32_t>(s.name.size()));
    header += s.name;
    Put<uint8_t>(&header, sizeof(T) == 4 ? 0 : 1);
    Put<uint32_t>(&header, static_cast<uint32_t>(s.dim));
  }
  for (const ChunkRow& row : table) {
    Put<int64_t>(&header, static_cast<int64_t>(row.offset));
    Put<uint32_t>(&header, row.sequences);
    Put<uint32_t>(&header, row.samples);
  }
  Put<int64_t>(&header, static_cast<int64_t>(header_offset));
  if (absl::Status st = out.Write(header); !st.ok()) return st;
  stats.chunks = table.size();
  stats.bytes = out.written();
  if (absl::Status st = out.Finish(); !st.ok()) return st;
  return stats;
}

}  // namespace

absl::StatusOr<CbfWriteStats> WriteCbf(const Dataset& dataset, const std::string& path, const CbfWriteOptions& options) {
  for (const StreamConfig& s : dataset.streams()) {
    if (s.format == StreamFormat::kIds) {
      return absl::InvalidArgumentError(absl::StrCat("stream '", s.name, "' has format ids, which CBF cannot hold"));
    }
  }
  return dataset.config().precision == Precision::kFloat ? Write<float>(dataset, path, options)
                                                         : Write<double>(dataset, path, options);
}

}  // namespace conveyor
