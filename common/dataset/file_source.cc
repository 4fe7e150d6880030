#include "common/dataset/file_source.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dataset/dataset.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// Appends parsed sequence `slot` of `from` to `to` (same format and dim), values as T.
template <typename T>
void AppendSequence(const ParsedStream& from, uint32_t slot, ParsedStream* to) {
  const uint64_t b = from.sequence_begin[slot];
  const uint64_t n = from.num_samples(slot);
  if (from.format == StreamFormat::kDense) {
    if (n > 0) {
      std::vector<T>& v = to->values<T>();
      const size_t at = v.size();
      v.resize(at + n * from.dim);
      from.DecodeDense<T>(slot, b, n, v.data() + at);
    }
  } else if (from.format == StreamFormat::kIds) {  // one id a sample
    to->indices.insert(to->indices.end(), from.indices.begin() + b, from.indices.begin() + b + n);
  } else {
    const uint64_t kb = from.nnz_begin[b], ke = from.nnz_begin[b + n];
    to->indices.insert(to->indices.end(), from.indices.begin() + kb, from.indices.begin() + ke);
    to->values<T>().insert(to->values<T>().end(), from.values<T>().begin() + kb, from.values<T>().begin() + ke);
    const uint64_t base = to->nnz_begin.back();
    for (uint64_t t = 1; t <= n; ++t) to->nnz_begin.push_back(base + from.nnz_begin[b + t] - kb);
  }
  to->sequence_begin.push_back(to->sequence_begin.back() + n);
}

class FileSource final : public KeyedSource {
 public:
  static absl::StatusOr<std::unique_ptr<KeyedSource>> Open(const DatasetConfig& parent, const DeserializerConfig& d,
                                                           const DatasetOpenOptions& options) {
    DatasetConfig own = parent;
    own.deserializers = {d};
    ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(own, options));
    std::unique_ptr<FileSource> src(new FileSource(std::move(ds), d.file));
    RETURN_IF_ERROR(src->Scan(options));
    return std::unique_ptr<KeyedSource>(std::move(src));
  }

  const std::vector<StreamConfig>& streams() const override { return ds_->streams(); }
  size_t size() const override { return entries_.size(); }
  const std::string& key(size_t i) const override { return keys_[i]; }
  uint32_t samples(size_t i, size_t k) const override { return samples_[i * ds_->streams().size() + k]; }
  uint64_t bytes(size_t i) const override { return entries_[i].bytes; }
  void WillNeed(size_t i) const override { ds_->WillNeed(entries_[i].chunk); }
  std::vector<std::string_view> inputs() const override { return ds_->inputs(); }
  std::vector<std::string> input_paths() const override { return ds_->input_paths(); }
  std::string description() const override { return path_; }
  uint64_t skipped() const override { return skipped_; }
  int64_t ParseUnit(size_t i) const override { return entries_[i].chunk; }

  absl::Status Decode(size_t i, Precision precision, ParsedStream* const* out) const override {
    const Entry& e = entries_[i];
    ASSIGN_OR_RETURN(std::shared_ptr<const ParsedChunk> chunk, Chunk(e.chunk));
    for (size_t k = 0; k < chunk->streams.size(); ++k) {
      if (precision == Precision::kFloat) AppendSequence<float>(chunk->streams[k], e.slot, out[k]);
      else AppendSequence<double>(chunk->streams[k], e.slot, out[k]);
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    uint32_t chunk = 0;  // the file's own chunk
    uint32_t slot = 0;   // the sequence's parsed slot in it
    uint64_t bytes = 0;
  };

  FileSource(std::unique_ptr<Dataset> ds, std::string path) : ds_(std::move(ds)), path_(std::move(path)) {}

  // Every chunk parsed once (on all cores, then dropped): the sequences it delivers, their
  // keys and per-stream counts, in file order.
  absl::Status Scan(const DatasetOpenOptions& options) {
    const Index& index = ds_->index();
    const size_t ns = ds_->streams().size();
    const uint64_t n = index.chunks.size();
    struct Found {
      absl::Status status;
      std::vector<Entry> entries;
      std::vector<std::string> keys;
      std::vector<uint32_t> samples;
      uint64_t skipped = 0;
    };
    std::vector<Found> found(n);
    const uint64_t errors_before = ds_->errors();
    std::atomic<uint64_t> next{0}, bytes_done{0};
    auto work = [&] {
      for (uint64_t c = next++; c < n; c = next++) {
        Found& f = found[c];
        auto chunk = ds_->ParseChunk(c);
        if (!chunk.ok()) {
          f.status = chunk.status();
          continue;
        }
        const ChunkEntry& ce = index.chunks[c];
        const uint64_t per_sequence = ce.num_sequences ? (ce.end_offset - ce.begin_offset) / ce.num_sequences : 0;
        for (uint64_t j = 0; j < ce.num_sequences; ++j) {
          const int32_t slot = (*chunk)->slot_of[j];
          if (slot < 0) {
            ++f.skipped;
            continue;
          }
          const SequenceEntry& se = index.sequences[ce.first_sequence + j];
          f.entries.push_back(Entry{static_cast<uint32_t>(c), static_cast<uint32_t>(slot), se.size ? se.size : per_sequence});
          f.keys.push_back(std::to_string((*chunk)->keys[slot]));
          for (size_t k = 0; k < ns; ++k) f.samples.push_back(static_cast<uint32_t>((*chunk)->streams[k].num_samples(slot)));
        }
        ds_->DoneWith(c);
        const uint64_t done = bytes_done += ds_->ChunkBytes(c);
        if (options.progress) options.progress(done, index.file_size);
      }
    };
    const unsigned threads = std::max(1, options.index_threads > 0 ? options.index_threads
                                                                    : static_cast<int>(std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < std::min<uint64_t>(threads, n); ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    // The scan is not a read: bad sequences it met count against maxErrors when they are read
    // (a budget past which it failed is an error all the same).
    ds_->RefundErrors(ds_->errors() - errors_before);
    for (Found& f : found) {
      if (!f.status.ok()) return f.status;  // the first failing chunk in file order
      entries_.insert(entries_.end(), f.entries.begin(), f.entries.end());
      for (std::string& k : f.keys) keys_.push_back(std::move(k));
      samples_.insert(samples_.end(), f.samples.begin(), f.samples.end());
      skipped_ += f.skipped;
    }
    return absl::OkStatus();
  }

  // A parsed chunk, from the few kept (most recent last) or parsed again.
  absl::StatusOr<std::shared_ptr<const ParsedChunk>> Chunk(uint32_t c) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, chunk] : recent_)
        if (id == c) return chunk;
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const ParsedChunk> chunk, ds_->SharedChunk(c));
    std::lock_guard<std::mutex> lock(mu_);
    recent_.emplace_back(c, chunk);
    if (recent_.size() > kKept) recent_.pop_front();
    return chunk;
  }

  static constexpr size_t kKept = 4;
  const std::unique_ptr<Dataset> ds_;
  const std::string path_;
  std::vector<Entry> entries_;
  std::vector<std::string> keys_;
  std::vector<uint32_t> samples_;  // entries x streams
  uint64_t skipped_ = 0;
  mutable std::mutex mu_;
  mutable std::deque<std::pair<uint32_t, std::shared_ptr<const ParsedChunk>>> recent_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KeyedSource>> OpenFileSource(const DatasetConfig& parent, const DeserializerConfig& d,
                                                            const DatasetOpenOptions& options) {
  return FileSource::Open(parent, d, options);
}

}  // namespace conveyor
