// libFuzzer: arbitrary bytes as an HTK feature file header, an MLF (text or binary, with and
// without a state list) and scp lines; and, after a 3-byte prefix, as a whole feature file
// read through a dataset with a context window (each frame's window of its neighbours, the
// utterance's edges repeated); frames left in the file are also assembled by the CUDA
// program on the host executor, which must write the CPU assembler's bytes. Any input must
// end in a status, never a read out of bounds (ASan) or undefined behaviour (UBSan).
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/formats/htk/htk_features.h"
#include "common/formats/htk/mlf.h"
#include "cuda/host_program.h"

namespace {

// A directory of this process's own for the feature file and its scp list, removed at exit.
// (Never destroyed: the exit handler still reads it.)
const std::string& Dir() {
  static const std::string* dir = [] {
    auto* t = new std::string("/tmp/conveyor-htk-fuzz.XXXXXX");
    if (mkdtemp(t->data()) == nullptr) std::abort();
    std::atexit([] {
      for (const char* name : {"/f.htk", "/f.scp"}) unlink((Dir() + name).c_str());
      rmdir(Dir().c_str());
    });
    return t;
  }();
  return *dir;
}

void Write(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Slot `slot` of `chunk` as a batch of one utterance, or of its frames as rows (frame mode),
// assembled by the CPU assembler and by the CUDA program on the host executor: the same bytes,
// or abort.
void ExpectTheProgramWritesTheCpuBytes(const std::vector<conveyor::StreamConfig>& streams,
                                       const conveyor::ParsedChunk& chunk, uint32_t slot, bool frames) {
  using namespace conveyor;
  std::vector<PieceRef> pieces;
  BatchShape shape;
  if (frames) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk.streams[0].num_samples(slot), 64));
    for (uint32_t t = 0; t < n; ++t) {
      PieceRef r;
      r.chunk = &chunk;
      r.slot = slot;
      r.sample_begin = t;
      r.sample_count = 1;
      r.row = t;
      r.frame = t;
      pieces.push_back(r);
    }
    shape.frame_mode = true;
  } else {
    PieceRef r;
    r.chunk = &chunk;
    r.slot = slot;
    pieces.push_back(r);
  }
  shape.rows = static_cast<uint32_t>(pieces.size());
  if (pieces.empty()) return;
  auto plan = PlanBatch(streams, Precision::kFloat, shape, pieces);
  if (!plan.ok()) return;
  static const std::unique_ptr<BatchAssembler> cpu = MakeCpuAssembler();
  static const std::unique_ptr<BatchAssembler> program = gpu::MakeHostProgramAssembler();
  std::vector<std::byte> want(plan->total_bytes), got(plan->total_bytes, std::byte{0xAB});
  if (!cpu->Assemble(*plan, pieces, absl::MakeSpan(want)).ok()) std::abort();
  if (!program->Assemble(*plan, pieces, absl::MakeSpan(got)).ok()) std::abort();
  if (want != got) std::abort();
}

// data[0] and data[1]: the window's left and right context (0-5 frames each); data[2]: a
// second scp entry over frames [0, data[2] / 4] when bit 0 is set, and the frames left in the
// file for the assembler (compressed_in_place, as the daemon opens datasets) and decoded from
// there, windows and all, when bit 1 is (and a frame at a time too when bit 2 is). The rest:
// the feature file.
void DecodeThroughADataset(const uint8_t* data, size_t size) {
  const int left = data[0] % 6, right = data[1] % 6;
  const std::string_view file(reinterpret_cast<const char*>(data) + 3, size - 3);
  // The input's dim must be the file's values a frame times the window (the config says it).
  auto header = conveyor::ParseHtkHeader(file, "f.htk");
  if (!header.ok()) return;
  const std::string& dir = Dir();
  Write(dir + "/f.htk", file);
  std::string scp = "u=.../f.htk\n";
  if (data[2] & 1) absl::StrAppend(&scp, "v=.../f.htk[0,", data[2] / 4, "]\n");
  Write(dir + "/f.scp", scp);
  const std::string yaml = absl::StrCat(
      "datasets:\n  h:\n    randomize: false\n    maxErrors: 1000000\n    deserializers:\n"
      "      - type: HTKFeature\n        input: {x: {scpFile: f.scp, dim: ", static_cast<uint64_t>(header->dim) * (left + 1 + right),
      ", contextWindow: [", left, ", ", right, "]}}\n");
  auto config = conveyor::ParseConfig(yaml, "fuzz.yaml", dir);
  if (!config.ok() || config->datasets.empty()) return;
  conveyor::DatasetOpenOptions options;
  options.index_threads = 1;
  options.diagnostics_sink = [](conveyor::Severity, const std::string&) {};
  options.compressed_in_place = (data[2] & 2) != 0;
  auto dataset = conveyor::Dataset::Open(config->datasets[0], options);
  if (!dataset.ok()) return;
  const size_t chunks = (*dataset)->index().chunks.size();
  std::vector<float> rows;
  for (size_t c = 0; c < chunks && c < 64; ++c) {
    auto chunk = (*dataset)->ParseChunk(c);
    if (!chunk.ok()) continue;
    // Every utterance's rows as an assembler reads them (decoded here when left in the file).
    for (const conveyor::ParsedStream& ps : (*chunk)->streams) {
      for (uint32_t slot = 0; slot + 1 < ps.sequence_begin.size(); ++slot) {
        // (Samples are numbered chunk-wide: the slot's first is sequence_begin[slot].)
        const uint64_t first = ps.sequence_begin[slot], n = ps.num_samples(slot);
        rows.resize(n * ps.dim);
        ps.DecodeDense<float>(slot, first, n, rows.data());
        if (data[2] & 4) {  // and a frame at a time, as frame mode reads them
          for (uint64_t t = 0; t < n; ++t) ps.DecodeDense<float>(slot, first + t, 1, rows.data());
        }
      }
    }
    // Left in the file: the CUDA program (its frames ops, run by the host executor) must write
    // the CPU assembler's bytes, for the utterance and for its frames as rows (runs of them).
    if (options.compressed_in_place) {
      for (uint32_t slot = 0; slot < (*chunk)->keys.size() && slot < 4; ++slot) {
        ExpectTheProgramWritesTheCpuBytes((*dataset)->streams(), **chunk, slot, (data[2] & 4) != 0);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)conveyor::ParseHtkHeader(bytes, "fuzz.htk");
  conveyor::Diagnostics diag(0, [](conveyor::Severity, const std::string&) {});
  (void)conveyor::ParseMlf(bytes, "fuzz.mlf", {}, 100000, &diag);
  (void)conveyor::ParseMlf(bytes, "fuzz.mlf", {"a", "b", "sil"}, 100000, &diag);
  (void)conveyor::ParseMlf(bytes, "fuzz.mlf", {}, 1, &diag);
  size_t at = 0;
  while (at < bytes.size()) {
    size_t eol = bytes.find('\n', at);
    if (eol == std::string_view::npos) eol = bytes.size();
    (void)conveyor::ParseHtkScpLine(bytes.substr(at, eol - at), "/scp");
    (void)conveyor::MlfKey(bytes.substr(at, eol - at));
    at = eol + 1;
  }
  if (size >= 3) DecodeThroughADataset(data, size);
  return 0;
}
