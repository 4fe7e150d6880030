// libFuzzer: arbitrary bytes as a Kaldi archive, read as a table of matrices, of vectors and
// of int32 vectors (strictly, and tolerating bad entries); every entry that scans is decoded
// in float and double. Any input must end in a status, never a read out of bounds (ASan) or
// undefined behaviour (UBSan).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_table.h"

using namespace conveyor::kaldi;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (ObjectKind kind : {ObjectKind::kMatrix, ObjectKind::kVector, ObjectKind::kInt32Vector}) {
    for (bool tolerate : {false, true}) {
      TableOptions o;
      o.kind = kind;
      if (tolerate) o.tolerate = [](const std::string&) { return true; };
      auto t = KaldiTable::OpenArchiveBytes(bytes, "fuzz.ark", o);
      if (!t.ok()) continue;
      std::vector<float> f;
      std::vector<double> d;
      std::vector<int32_t> ids;
      for (size_t i = 0; i < (*t)->entries().size(); ++i) {
        const Window& w = (*t)->entries()[i].window;
        if (kind == ObjectKind::kInt32Vector) {
          (*t)->DecodeInts(i, &ids);
          continue;
        }
        const uint64_t n = static_cast<uint64_t>(w.rows) * static_cast<uint64_t>(w.cols);
        if (n > (64u << 20)) continue;  // a legal but huge header: memory, not correctness
        f.assign(n, 0.f);
        d.assign(n, 0.);
        (*t)->Decode<float>(i, f.data());
        (*t)->Decode<double>(i, d.data());
      }
    }
  }
  return 0;
}
