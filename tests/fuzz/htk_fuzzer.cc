// libFuzzer: arbitrary bytes as an HTK feature file header, an MLF (text or binary, with and
// without a state list) and scp lines. Any input must end in a status, never a read out of
// bounds (ASan) or undefined behaviour (UBSan).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/formats/htk/htk_features.h"
#include "common/formats/htk/mlf.h"

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
  return 0;
}
