// builtin_formats.cc: the formats built into conveyor, one registration line each. A new
// format is a folder under common/formats/ with a factory (deserializer.h) and a line here.
#include "common/formats/cbf/cbf_deserializer.h"
#include "common/formats/ctf/ctf_deserializer.h"
#include "common/formats/htk/htk_features.h"
#include "common/formats/htk/mlf.h"
#include "common/formats/kaldi/kaldi_source.h"
#include "common/formats/registry.h"

namespace conveyor {

void RegisterBuiltinFormats(DeserializerRegistry& registry) {
  registry.Register("CNTKTextFormat", OpenCtfDeserializer);
  registry.Register("CNTKBinary", OpenCbfDeserializer);
  registry.Register("HTKFeature", OpenHtkFeatureDeserializer);
  registry.Register("HTKMLF", OpenMlfDeserializer);
  registry.Register("KaldiTable", OpenKaldiDeserializer);
}

}  // namespace conveyor
