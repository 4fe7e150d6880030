// loader_cases.h: whole-loader comparisons for the assembler tests: a dataset's batches
// through a pipelined assembler (two in flight, into slots of a given memory kind, as the
// daemon runs it) must equal the CPU loader's, byte for byte. The datasets: a randomized
// sparse + dense CTF file, Kaldi CM, CM2 and CM3 archives (tests/data/kaldi) with an scp
// row/column range, left compressed in the chunks for the assembler's decode ops, and HTK
// features left in their files.
#pragma once

#include <vector>

#include "common/batch/assembler.h"
#include "common/config/dataset_config.h"
#include "common/dataset/dataset.h"
#include "common/sampling/loader.h"
#include "cuda/slot_pool.h"

namespace conveyor::testing {

// Every batch of `config` opened with `open`, loaded with `lo` through `assembler` (two in
// flight, slots of `kind`), equals the CPU loader's over `config` opened plainly.
void ExpectPipelinedLoaderMatchesTheCpuLoader(const DatasetConfig& config, const DatasetOpenOptions& open,
                                              const LoaderOptions& lo, BatchAssembler* assembler, gpu::MemoryKind kind);

// A randomized sparse + dense CTF file of many small chunks.
DatasetConfig CtfConfig();

// Randomized (window 3) loader options, utterances or frames.
LoaderOptions Randomized(uint64_t minibatch, bool frames);

// Every compressed Kaldi configuration (CM, CM2, CM3, the speech archive, an scp range; float
// and double), left compressed in the chunks, in utterances, random frames and frames in
// file order (merged decode runs), through `assembler`.
void ExpectCompressedKaldiMatchesTheCpuLoader(BatchAssembler* assembler, gpu::MemoryKind kind);

// HTK features left in their files for the assembler (big-endian float32 and _C, no window
// and context windows; float and double), in utterances, random frames and frames in file
// order, through `assembler`: a codec no device kernel decodes, decoded on the host.
void ExpectHtkFramesMatchTheCpuLoader(BatchAssembler* assembler, gpu::MemoryKind kind);

}  // namespace conveyor::testing
