// batch_cases.h: generated batches for comparing assemblers byte for byte (CPU reference,
// the host program, CUDA): dense, sparse (CSC, CSR, dense), ids; frame mode, sequences,
// truncated BPTT; empty columns, nnz = 0, dims up to 10^6, batch sizes 1 to 8192; float
// and double. Deterministic: a case is made from its spec and seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/batch/batch_layout.h"

namespace conveyor::testing {

enum class Mode { kFrame, kSequence, kBptt };

struct StreamSpec {
  StreamFormat format = StreamFormat::kDense;
  uint64_t dim = 1;
  OutputLayout layout = OutputLayout::kNative;
  double empty_fraction = 0;  // sparse: share of samples with no entries (1: nnz = 0)
  uint32_t max_nnz = 8;       // sparse: entries of a sample at most (repeats allowed)
};

struct CaseSpec {
  std::string name;
  uint32_t rows = 1;
  Mode mode = Mode::kSequence;
  uint32_t max_length = 1;  // samples of a sequence at most (BPTT: the truncation length)
  Precision precision = Precision::kFloat;
  double empty_rows = 0;    // share of rows left without a piece
  std::vector<StreamSpec> streams;
};

struct BatchCase {
  CaseSpec spec;
  std::vector<StreamConfig> streams;
  BatchShape shape;
  std::vector<OutputLayout> layouts;
  std::vector<std::unique_ptr<ParsedChunk>> chunks;
  std::vector<PieceRef> pieces;
};

BatchCase MakeBatchCase(const CaseSpec& spec, uint64_t seed);

// Output types that narrow a case's values: float16 and bfloat16 in turn by stream, ids left
// float32 (for PlanBatch's `dtypes`).
std::vector<DType> NarrowedDTypes(const BatchCase& c);

// The standard set the assembler tests run over.
std::vector<CaseSpec> StandardCases();

}  // namespace conveyor::testing
