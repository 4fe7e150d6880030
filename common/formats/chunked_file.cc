#include "common/formats/chunked_file.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
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
      HugeVector<T>& v = to->values<T>();
      const size_t at = v.size();
      v.resize(at + n * from.dim);
      from.DecodeDense<T>(slot, b, n, v.data() + at);
    }
  } else if (from.format == StreamFormat::kIds) {  // one id a sample
    to->indices.insert(to->indices.end(), from.indices.begin() + b, from.indices.begin() + b + n);
  } else {
    const uint64_t kb = from.nnz_begin[b], ke = from.nnz_begin[b + n];
    if (ke > kb) {  // from the chunk's columns, or where they lie in the file (CBF)
      const size_t ia = to->indices.size(), va = to->values<T>().size();
      to->indices.resize(ia + (ke - kb));
      to->values<T>().resize(va + (ke - kb));
      std::memcpy(to->indices.data() + ia, from.SparseIndexBytes(slot, kb), (ke - kb) * sizeof(int32_t));
      std::memcpy(to->values<T>().data() + va, from.SparseValueBytes(slot, kb, sizeof(T)), (ke - kb) * sizeof(T));
    }
    const uint64_t base = to->nnz_begin.back();
    for (uint64_t t = 1; t <= n; ++t) to->nnz_begin.push_back(base + from.nnz_begin[b + t] - kb);
  }
  to->sequence_begin.push_back(to->sequence_begin.back() + n);
}

}  // namespace

ChunkedFileDeserializer::ChunkedFileDeserializer(const DeserializerContext& context)
    : diagnostics_(context.diagnostics), budget_(context.budget) {
  if (context.member) {  // as it was when a member was opened as a dataset of its own
    own_diagnostics_ = std::make_unique<Diagnostics>(context.dataset.EffectiveTraceLevel(), context.options.diagnostics_sink);
    own_budget_ = std::make_unique<ErrorBudget>(
        context.options.max_errors_override.value_or(context.dataset.EffectiveMaxErrors()));
    diagnostics_ = own_diagnostics_.get();
    budget_ = own_budget_.get();
  }
}

absl::Status ChunkedFileDeserializer::MapFile(const DeserializerContext& context) {
  path_ = context.config.file;
  ASSIGN_OR_RETURN(file_, MappedFile::Open(context.config.file, /*readable=*/true));
  return absl::OkStatus();
}

absl::StatusOr<HugeBytes> ChunkedFileDeserializer::ReadChunk(uint64_t chunk_id) const {
  if (chunk_id >= index_.chunks.size()) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": chunk ", chunk_id, " of ", index_.chunks.size()));
  }
  const ChunkEntry& c = index_.chunks[chunk_id];
  HugeBytes bytes(c.end_offset - c.begin_offset);
  RETURN_IF_ERROR(file_->Read(c.begin_offset, bytes.size(), bytes.data()));
  return bytes;
}

absl::Status ChunkedFileDeserializer::FinishOpen(const DeserializerContext& context) {
  if (!context.member) return absl::OkStatus();
  cache_ = std::make_unique<ChunkCache>([this](uint64_t c) { return CountedParse(c); }, nullptr);
  return Scan(context);
}

absl::StatusOr<std::unique_ptr<ParsedChunk>> ChunkedFileDeserializer::CountedParse(
    uint64_t c) const {
  chunks_parsed_.fetch_add(1);
  return ParseChunk(c);
}

absl::Status ChunkedFileDeserializer::ListChunk(uint64_t c, ChunkSequences* out) const {
  ASSIGN_OR_RETURN(std::unique_ptr<ParsedChunk> chunk, CountedParse(c));
  out->samples.clear();
  for (size_t slot = 0; slot < chunk->keys.size(); ++slot) {
    for (const ParsedStream& ps : chunk->streams) {
      out->samples.push_back(static_cast<uint32_t>(ps.num_samples(slot)));
    }
  }
  out->slot_of = std::move(chunk->slot_of);  // the chunk is dropped right after
  out->keys = std::move(chunk->keys);
  return absl::OkStatus();
}

// Every chunk listed once (on all cores): the sequences it
// delivers, their keys and per-stream counts, in file order.
absl::Status ChunkedFileDeserializer::Scan(const DeserializerContext& context) {
  const Index& index = index_;
  const size_t ns = streams_.size();
  const uint64_t n = index.chunks.size();
  struct Found {
    absl::Status status;
    std::vector<Entry> entries;
    std::vector<std::string> keys;
    std::vector<uint32_t> samples;
    uint64_t skipped = 0;
  };
  std::vector<Found> found(n);
  const uint64_t errors_before = budget_->spent();
  std::atomic<uint64_t> next{0}, bytes_done{0};
  auto work = [&] {
    for (uint64_t c = next++; c < n; c = next++) {
      Found& f = found[c];
      ChunkSequences listed;
      f.status = ListChunk(c, &listed);
      if (!f.status.ok()) continue;
      const ChunkEntry& ce = index.chunks[c];
      const uint64_t per_sequence = ce.num_sequences ? (ce.end_offset - ce.begin_offset) / ce.num_sequences : 0;
      for (uint64_t j = 0; j < ce.num_sequences; ++j) {
        const int32_t slot = listed.slot_of[j];
        if (slot < 0) {
          ++f.skipped;
          continue;
        }
        const SequenceEntry& se = index.sequences[ce.first_sequence + j];
        f.entries.push_back(Entry{static_cast<uint32_t>(c), static_cast<uint32_t>(slot), se.size ? se.size : per_sequence});
        f.keys.push_back(std::to_string(listed.keys[slot]));
        f.samples.insert(f.samples.end(), listed.samples.begin() + static_cast<size_t>(slot) * ns,
                         listed.samples.begin() + static_cast<size_t>(slot + 1) * ns);
      }
      const uint64_t done = bytes_done += ce.end_offset - ce.begin_offset;
      if (context.progress) context.progress(done, index.file_size);
    }
  };
  const int index_threads = context.options.index_threads;
  const unsigned threads = std::max(1, index_threads > 0 ? index_threads
                                                         : static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<uint64_t>(threads, n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  // The scan is not a read: bad sequences it met count against maxErrors when they are read
  // (a budget past which it failed is an error all the same).
  budget_->Refund(budget_->spent() - errors_before);
  for (Found& f : found) {
    if (!f.status.ok()) return f.status;  // the first failing chunk in file order
    entries_.insert(entries_.end(), f.entries.begin(), f.entries.end());
    for (std::string& k : f.keys) keys_.push_back(std::move(k));
    samples_.insert(samples_.end(), f.samples.begin(), f.samples.end());
    skipped_ += f.skipped;
  }
  return absl::OkStatus();
}

absl::Status ChunkedFileDeserializer::Decode(size_t i, Precision precision, ParsedStream* const* out) const {
  const Entry& e = entries_[i];
  ASSIGN_OR_RETURN(std::shared_ptr<const ParsedChunk> chunk, Chunk(e.chunk));
  for (size_t k = 0; k < chunk->streams.size(); ++k) {
    if (precision == Precision::kFloat) AppendSequence<float>(chunk->streams[k], e.slot, out[k]);
    else AppendSequence<double>(chunk->streams[k], e.slot, out[k]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ParsedChunk>> ChunkedFileDeserializer::Chunk(uint32_t c) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, chunk] : recent_)
      if (id == c) return chunk;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const ParsedChunk> chunk, cache_->Get(c));
  std::lock_guard<std::mutex> lock(mu_);
  recent_.emplace_back(c, chunk);
  if (recent_.size() > kKept) recent_.pop_front();
  return chunk;
}

}  // namespace conveyor
