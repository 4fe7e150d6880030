#include "common/formats/cbf/cbf_deserializer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/cbf/cbf_reader.h"
#include "common/formats/chunked_file.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

class CbfDeserializer final : public ChunkedFileDeserializer {
 public:
  explicit CbfDeserializer(const DeserializerContext& context)
      : ChunkedFileDeserializer(context), precision_(context.dataset.precision) {}

  absl::Status Open(const DeserializerContext& context);

  absl::StatusOr<std::unique_ptr<ParsedChunk>> ParseChunk(uint64_t chunk_id) const override {
    ASSIGN_OR_RETURN(HugeBytes bytes, ReadChunk(chunk_id));
    ASSIGN_OR_RETURN(std::unique_ptr<ParsedChunk> chunk,
                     ParseCbfChunk({bytes.data(), bytes.size()}, index_.chunks[chunk_id].begin_offset, *cbf_, index_,
                                   chunk_id, cbf_source_, precision_, path_));
    // Values used where they lie point into the bytes read: the chunk holds them.
    for (const ParsedStream& ps : chunk->streams) {
      if (!ps.in_place.empty() || !ps.sparse_values_in_place.empty()) {
        chunk->file_bytes = std::move(bytes);
        break;
      }
    }
    return chunk;
  }

 protected:
  // A member's open reads the counts the file states instead of parsing (chunked_file.h).
  absl::Status ListChunk(uint64_t c, ChunkSequences* out) const override {
    CbfChunkCounts counts;
    const ChunkEntry& ce = index_.chunks[c];
    absl::Status counted = CountCbfChunk(file_->bytes(), *cbf_, index_, c, cbf_source_, precision_, path_, &counts);
    DropPages(ce.begin_offset, ce.end_offset - ce.begin_offset);  // walked through the mapping
    RETURN_IF_ERROR(counted);
    out->keys.clear();
    for (uint32_t j = 0; j < ce.num_sequences; ++j) {
      if (counts.slot_of[j] >= 0) out->keys.push_back(index_.sequences[ce.first_sequence + j].key);
    }
    out->slot_of = std::move(counts.slot_of);
    out->samples = std::move(counts.samples);
    return absl::OkStatus();
  }

 private:
  // The configured streams (all of the file's without `input`) checked against the file's.
  absl::Status SelectStreams();

  const Precision precision_;
  std::unique_ptr<CbfFile> cbf_;  // the file's header and chunk table
  std::vector<int> cbf_source_;   // per stream: the file stream it reads
};

absl::Status CbfDeserializer::Open(const DeserializerContext& context) {
  const DeserializerConfig& d = context.config;
  streams_ = d.streams;
  RETURN_IF_ERROR(MapFile(context));
  const std::string_view bytes = file_->bytes();
  if (!IsCbf(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(d.file, ": not a CNTK binary file (expected the magic number "
                                                   "\"cntk_bin\" or the documented layout's version 1 at byte 0; convert text with `conveyor convert`)"));
  }
  ASSIGN_OR_RETURN(CbfFile file, ReadCbfFile(bytes, d.file));
  cbf_ = std::make_unique<CbfFile>(std::move(file));
  for (const CbfStreamInfo& s : cbf_->streams) {
    if (s.precision != precision_) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.file, ": stream '", s.name, "' holds ", s.precision == Precision::kFloat ? "float" : "double",
          " values but the dataset's precision is ", precision_ == Precision::kFloat ? "float" : "double",
          " (set `precision: ", s.precision == Precision::kFloat ? "float" : "double", "`)"));
    }
  }
  RETURN_IF_ERROR(SelectStreams());
  if (context.progress) context.progress(0, file_->bytes().size());
  ASSIGN_OR_RETURN(index_, BuildCbfIndex(*cbf_, bytes, d.file));
  DropPages(0, bytes.size());  // the walk read the documented layout's chunks through the mapping
  if (context.progress) context.progress(file_->bytes().size(), file_->bytes().size());
  return FinishOpen(context);
}

absl::Status CbfDeserializer::SelectStreams() {
  auto file_names = [&] {
    std::string out;
    for (const CbfStreamInfo& s : cbf_->streams) absl::StrAppend(&out, out.empty() ? "" : ", ", s.name);
    return out;
  };
  // Without `input`, every stream of the file under its own name; with it, the named streams
  // (`alias`: the file's name for it), checked against what the file declares.
  if (streams_.empty()) {
    for (const CbfStreamInfo& s : cbf_->streams) {
      StreamConfig sc;
      sc.name = sc.alias = s.name;
      sc.format_given = false;
      streams_.push_back(sc);
    }
  }
  for (StreamConfig& sc : streams_) {
    int found = -1;
    for (size_t i = 0; i < cbf_->streams.size(); ++i)
      if (cbf_->streams[i].name == sc.alias) found = static_cast<int>(i);
    if (found < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": input '", sc.name, "' names stream '", sc.alias,
                                                     "', which the file does not have (it has: ", file_names(), ")"));
    }
    const CbfStreamInfo& s = cbf_->streams[found];
    if ((sc.format_given && sc.format != s.format) || (sc.dim != 0 && sc.dim != s.dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": input '", sc.name, "' is configured as ", StreamFormatName(sc.format), " dim ", sc.dim,
          " but the file's stream '", s.name, "' is ", StreamFormatName(s.format), " dim ", s.dim));
    }
    sc.format = s.format;
    sc.dim = s.dim;
    cbf_source_.push_back(found);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Deserializer>> OpenCbfDeserializer(const DeserializerContext& context) {
  auto d = std::make_unique<CbfDeserializer>(context);
  RETURN_IF_ERROR(d->Open(context));
  return std::unique_ptr<Deserializer>(std::move(d));
}

}  // namespace conveyor
