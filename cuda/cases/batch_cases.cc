#include "cuda/cases/batch_cases.h"

#include <algorithm>
#include <random>

namespace conveyor::testing {
namespace {

constexpr uint32_t kChunks = 3;

// Appends one sequence to every stream of `chunk`, `lens[s]` samples in stream s.
void AddSequence(const CaseSpec& spec, const std::vector<uint32_t>& lens, std::mt19937_64& rng, ParsedChunk* chunk) {
  std::uniform_real_distribution<double> value(-4, 4);
  std::uniform_real_distribution<double> unit(0, 1);
  for (size_t s = 0; s < spec.streams.size(); ++s) {
    const StreamSpec& ss = spec.streams[s];
    ParsedStream& ps = chunk->streams[s];
    const uint32_t len = lens[s];
    auto push_value = [&] {
      const double v = value(rng);
      if (spec.precision == Precision::kFloat) ps.values_f32.push_back(static_cast<float>(v));
      else ps.values_f64.push_back(v);
    };
    for (uint32_t t = 0; t < len; ++t) {
      if (ss.format == StreamFormat::kDense) {
        for (uint64_t d = 0; d < ss.dim; ++d) push_value();
      } else if (ss.format == StreamFormat::kIds) {
        ps.indices.push_back(static_cast<int32_t>(rng() % ss.dim));
      } else {
        const uint32_t n = unit(rng) < ss.empty_fraction ? 0 : 1 + static_cast<uint32_t>(rng() % ss.max_nnz);
        for (uint32_t k = 0; k < n; ++k) {
          ps.indices.push_back(static_cast<int32_t>(rng() % ss.dim));
          push_value();
        }
        ps.nnz_begin.push_back(ps.indices.size());
      }
    }
    ps.sequence_begin.push_back(ps.sequence_begin.back() + len);
  }
  chunk->keys.push_back(chunk->keys.size() + 1000 * chunk->chunk_id);
  chunk->lengths.push_back(*std::max_element(lens.begin(), lens.end()));
  chunk->slot_of.push_back(static_cast<int32_t>(chunk->slot_of.size()));
}

}  // namespace

std::vector<DType> NarrowedDTypes(const BatchCase& c) {
  std::vector<DType> dtypes;
  for (size_t s = 0; s < c.streams.size(); ++s) {
    dtypes.push_back(c.streams[s].format == StreamFormat::kIds ? DType::kFloat32
                                                               : (s % 2 ? DType::kBFloat16 : DType::kFloat16));
  }
  return dtypes;
}

BatchCase MakeBatchCase(const CaseSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  BatchCase c;
  c.spec = spec;
  for (size_t s = 0; s < spec.streams.size(); ++s) {
    StreamConfig sc;
    sc.name = sc.alias = "s" + std::to_string(s);
    sc.format = spec.streams[s].format;
    sc.dim = spec.streams[s].dim;
    c.streams.push_back(sc);
    c.layouts.push_back(spec.streams[s].layout);
  }
  c.shape.rows = spec.rows;
  c.shape.frame_mode = spec.mode == Mode::kFrame;
  c.shape.steps = spec.mode == Mode::kBptt ? spec.max_length : 0;
  for (uint32_t k = 0; k < kChunks; ++k) {
    auto chunk = std::make_unique<ParsedChunk>();
    chunk->chunk_id = k;
    chunk->precision = spec.precision;
    chunk->streams.resize(spec.streams.size());
    for (size_t s = 0; s < spec.streams.size(); ++s) {
      chunk->streams[s].format = spec.streams[s].format;
      chunk->streams[s].dim = static_cast<uint32_t>(spec.streams[s].dim);
    }
    c.chunks.push_back(std::move(chunk));
  }
  const uint32_t max_len = std::max<uint32_t>(spec.max_length, 1);
  for (uint32_t row = 0; row < spec.rows; ++row) {
    if (unit(rng) < spec.empty_rows) continue;
    // BPTT: pieces of several sequences one after another along the row, the first one
    // possibly the tail of a longer sequence, the last possibly cut.
    uint32_t t0 = 0;
    do {
      ParsedChunk* chunk = c.chunks[rng() % kChunks].get();
      const uint32_t len = spec.mode == Mode::kFrame ? 1 : 1 + static_cast<uint32_t>(rng() % max_len);
      const uint32_t full = spec.mode == Mode::kBptt ? len + static_cast<uint32_t>(rng() % 3) : len;
      // Sequence mode: streams of one sequence may differ in length (padding per stream).
      std::vector<uint32_t> lens(spec.streams.size(), full);
      if (spec.mode == Mode::kSequence) {
        for (size_t s = 1; s < lens.size(); ++s) lens[s] = 1 + static_cast<uint32_t>(rng() % max_len);
      }
      AddSequence(spec, lens, rng, chunk);
      PieceRef p;
      p.chunk = chunk;
      p.slot = static_cast<uint32_t>(chunk->num_sequences() - 1);
      p.row = row;
      p.t0 = t0;
      if (spec.mode == Mode::kBptt) {
        p.sample_begin = full - len;
        p.sample_count = std::min(len, spec.max_length - t0);
        p.begins = p.sample_begin == 0;
        p.ends = p.sample_begin + p.sample_count == full;
        t0 += p.sample_count;
      }
      c.pieces.push_back(p);
    } while (spec.mode == Mode::kBptt && t0 < spec.max_length && rng() % 2 == 0);
  }
  return c;
}

std::vector<CaseSpec> StandardCases() {
  using F = StreamFormat;
  using L = OutputLayout;
  std::vector<CaseSpec> cases;
  auto add = [&](std::string name, uint32_t rows, Mode mode, uint32_t max_length, Precision precision,
                 std::vector<StreamSpec> streams, double empty_rows = 0) {
    CaseSpec spec;
    spec.name = std::move(name);
    spec.rows = rows;
    spec.mode = mode;
    spec.max_length = max_length;
    spec.precision = precision;
    spec.streams = std::move(streams);
    spec.empty_rows = empty_rows;
    cases.push_back(std::move(spec));
  };
  const Precision f = Precision::kFloat, d = Precision::kDouble;
  add("dense_frame_1", 1, Mode::kFrame, 1, f, {{F::kDense, 3}});
  add("dense_frame_8192", 8192, Mode::kFrame, 1, f, {{F::kDense, 40}, {F::kIds, 5000}});
  add("dense_frame_odd_dim", 333, Mode::kFrame, 1, d, {{F::kDense, 7}});
  add("dense_sequences", 64, Mode::kSequence, 50, f, {{F::kDense, 13}, {F::kDense, 1}}, 0.1);
  add("dense_sequences_double", 17, Mode::kSequence, 9, d, {{F::kDense, 5}});
  add("ids_sequences", 100, Mode::kSequence, 30, f, {{F::kIds, 9000}, {F::kDense, 2}});
  add("sparse_csc_frame", 1024, Mode::kFrame, 1, f, {{F::kSparse, 1000, L::kNative, 0.3}});
  add("sparse_csc_sequences", 50, Mode::kSequence, 40, f, {{F::kSparse, 1000000, L::kNative, 0.2, 20}}, 0.1);
  add("sparse_nnz_zero", 33, Mode::kSequence, 4, f, {{F::kSparse, 50, L::kNative, 1.0}, {F::kDense, 2}});
  add("sparse_csr", 300, Mode::kSequence, 6, f, {{F::kSparse, 2000, L::kCsr, 0.25, 6}});
  add("sparse_csr_nnz_zero", 8, Mode::kFrame, 1, d, {{F::kSparse, 10, L::kCsr, 1.0}});
  add("sparse_dense_repeats", 40, Mode::kSequence, 5, f, {{F::kSparse, 16, L::kDense, 0.2, 30}});
  add("sparse_dense_double", 200, Mode::kFrame, 1, d, {{F::kSparse, 100, L::kDense, 0.5, 12}});
  add("bptt_mixed", 32, Mode::kBptt, 20, f,
      {{F::kDense, 8}, {F::kSparse, 5000, L::kNative, 0.1}, {F::kIds, 30}, {F::kSparse, 64, L::kCsr}});
  add("bptt_double_dense_sparse", 7, Mode::kBptt, 11, d, {{F::kDense, 3}, {F::kSparse, 12, L::kDense, 0.3, 5}}, 0.2);
  // Many repeated indices in a sample: a CSR row's order for them is the CSC order.
  add("sparse_csr_repeats", 64, Mode::kSequence, 5, f, {{F::kSparse, 5, L::kCsr, 0.1, 40}});
  // One row: no radix pass at all (every entry is in row 0).
  add("sparse_csr_one_row", 12, Mode::kFrame, 1, f, {{F::kSparse, 1, L::kCsr, 0.2, 3}});
  // Rows past 2^20: three radix passes in the CSR transpose.
  add("sparse_csr_wide_double", 40, Mode::kFrame, 1, d, {{F::kSparse, (1 << 20) + 3, L::kCsr, 0.2, 12}});
  // Pieces past kCscPieceEntries entries, and sparse-as-dense samples past
  // kScatterBandEntries: split over several blocks and threads.
  add("sparse_csc_long_pieces", 6, Mode::kSequence, 300, f, {{F::kSparse, 5000, L::kNative, 0, 200}});
  add("sparse_dense_long", 16, Mode::kFrame, 1, f, {{F::kSparse, 300, L::kDense, 0, 600}});
  // No rows: what a rank that owns no chunk of a minibatch gets. Dense alone: a batch of no
  // bytes (a null destination); with sparse streams: a colptr of one 0, a CSR rowptr of zeros.
  add("empty_dense_frame", 0, Mode::kFrame, 1, f, {{F::kDense, 3}, {F::kIds, 10}});
  add("empty_mixed_sequences", 0, Mode::kSequence, 5, f,
      {{F::kDense, 4}, {F::kSparse, 100, L::kNative, 0.2}, {F::kSparse, 50, L::kCsr}, {F::kIds, 7},
       {F::kSparse, 20, L::kDense}});
  add("empty_bptt", 0, Mode::kBptt, 6, d, {{F::kDense, 2}, {F::kSparse, 30, L::kNative}});
  add("everything_large", 8192, Mode::kFrame, 1, f,
      {{F::kDense, 64}, {F::kSparse, 1000000, L::kNative, 0.05, 40}, {F::kSparse, 30000, L::kCsr, 0.1, 10},
       {F::kIds, 100}, {F::kSparse, 256, L::kDense, 0, 8}});
  return cases;
}

}  // namespace conveyor::testing
