#include "cuda/cases/compressed_cases.h"

#include <algorithm>

#include "common/formats/kaldi/kaldi_object.h"

namespace conveyor::testing {
namespace {

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

std::string RandomCompressed(int format, int32_t rows, int32_t cols, std::mt19937& rng) {
  std::string s("\0B", 2);
  s += format == 1 ? "CM " : format == 2 ? "CM2 " : "CM3 ";
  std::uniform_real_distribution<float> u(-50, 50);
  const float min_value = u(rng), range = std::abs(u(rng)) + 0.001f;
  Put(&s, min_value);
  Put(&s, range);
  Put(&s, rows);
  Put(&s, cols);
  if (format == 1) {
    for (int32_t c = 0; c < cols; ++c) {
      uint16_t p[4];
      for (uint16_t& v : p) v = static_cast<uint16_t>(rng());
      std::sort(p, p + 4);
      for (uint16_t v : p) Put(&s, v);
    }
  }
  const int width = format == 2 ? 2 : 1;
  for (int64_t i = 0; i < int64_t{rows} * cols * width; ++i) s.push_back(static_cast<char>(rng()));
  return s;
}

CompressedCase MakeCompressedCase(std::vector<std::string> objects, int64_t row0, int64_t col0, uint32_t cols,
                                  CompressedPieces pieces, uint64_t seed) {
  CompressedCase c;
  c.chunk = std::make_unique<ParsedChunk>();
  ParsedStream ps;
  ps.format = StreamFormat::kDense;
  ps.dim = cols;
  for (std::string& o : objects) {
    c.objects.push_back(std::make_unique<std::string>(std::move(o)));
    const std::string& bytes = *c.objects.back();
    auto info = kaldi::ScanObject(bytes, 0, kaldi::ObjectKind::kMatrix);
    if (!info.ok() || info->rows <= row0 || info->cols < col0 + cols) continue;  // the test's ASSERTs will say
    const auto samples = static_cast<uint64_t>(info->rows - row0);
    ps.compressed.push_back(CompressedDense{bytes.data(), *info, row0, col0});
    ps.sequence_begin.push_back(ps.sequence_begin.back() + samples);
    c.chunk->keys.push_back(c.chunk->keys.size());
    c.chunk->lengths.push_back(static_cast<uint32_t>(samples));
    c.chunk->slot_of.push_back(static_cast<int32_t>(c.chunk->slot_of.size()));
  }
  c.chunk->streams = {ps};
  c.streams = {{"f", "f", StreamFormat::kDense, cols, false}};
  std::mt19937_64 rng(seed);
  const ParsedStream& s = c.chunk->streams[0];
  auto frame = [&](uint32_t slot, uint32_t f) {
    PieceRef r;
    r.chunk = c.chunk.get();
    r.slot = slot;
    r.sample_begin = f;
    r.sample_count = 1;
    r.row = static_cast<uint32_t>(c.pieces.size());
    r.frame = f;
    c.pieces.push_back(r);
  };
  const auto sequences = static_cast<uint32_t>(s.compressed.size());
  switch (pieces) {
    case CompressedPieces::kUtterances:
      for (uint32_t slot = 0; slot < sequences; ++slot) {
        PieceRef r;
        r.chunk = c.chunk.get();
        r.slot = slot;
        r.row = slot;
        c.pieces.push_back(r);
      }
      c.shape.rows = sequences;
      return c;
    case CompressedPieces::kFramesInOrder:
      for (uint32_t slot = 0; slot < sequences && c.pieces.size() < 4096; ++slot) {
        for (uint32_t f = 0; f < s.num_samples(slot) && c.pieces.size() < 4096; ++f) frame(slot, f);
      }
      break;
    case CompressedPieces::kRandomFrames:
      for (int i = 0; i < 300 && sequences > 0; ++i) {
        const auto slot = static_cast<uint32_t>(rng() % sequences);
        frame(slot, static_cast<uint32_t>(rng() % s.num_samples(slot)));
      }
      break;
  }
  c.shape.rows = static_cast<uint32_t>(c.pieces.size());
  c.shape.frame_mode = true;
  return c;
}

}  // namespace conveyor::testing
