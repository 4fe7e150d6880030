// HTK features + MLF labels against CNTK: the reconstructed AN4 subset read with CNTK's own
// HTKMLFReader configuration (BrainScript, unchanged) reproduces CNTK's control output
// HTKMLFReaderSimpleDataLoop2_12_Control.txt token for token (frame mode, 11-frame context
// windows with edge replication across utterance boundaries, state-list labels, MLF times);
// the binary MLF mlf2.bin decodes to exactly the text MLF; headers, compressed (_C) files,
// scp forms, MLF errors and truncations by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <tuple>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/batch/assembler.h"
#include "common/chunk/compressed.h"
#include "common/config/config_loader.h"
#include "common/formats/htk/htk_features.h"
#include "common/formats/htk/mlf.h"
#include "common/sampling/loader.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

std::string An4Dir() { return TestdataDir() + "/cntk/HTK/an4_first3_reconstructed"; }
std::string SpeechDir() { return TestdataDir() + "/cntk/Speech/Data"; }

TEST(HtkGolden, CntkControlOutputOfTheReconstructedAn4Subset) {
  auto config = LoadConfigFile(An4Dir() + "/an4_first3_Config.cntk");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->datasets.size(), 1u);
  const DatasetConfig& ds = config->datasets[0];
  ASSERT_EQ(ds.deserializers.size(), 2u);
  EXPECT_EQ(ds.deserializers[0].type, "HTKFeature");
  EXPECT_EQ(ds.deserializers[1].type, "HTKMLF");
  EXPECT_FALSE(ds.randomize);  // readMethod = "none"
  // HTKLMFReaderTests.cpp: epochSize 500, minibatch 250, 2 epochs. Frames decoded into the
  // chunks, and left in the file and decoded with their windows as batches are assembled (the
  // daemon's way, frame mode included).
  const std::vector<std::string> expected = Tokens(ReadFile(TestdataDir() + "/cntk/HTK/Control/HTKMLFReaderSimpleDataLoop2_12_Control.txt"));
  // 4 minibatches x (250 x 363 features + 250 x 132 labels).
  ASSERT_EQ(expected.size(), 4u * 250 * (363 + 132));
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "left in the file" : "decoded into the chunks");
    ReadOptions ro;
    ro.epoch_size = 500;
    ro.minibatch_size = 250;
    ro.epochs = 2;
    ro.compressed_in_place = in_place;
    auto ours = CntkControlTokens(ds, ro);
    ASSERT_TRUE(ours.ok()) << ours.status();
    ASSERT_EQ(ours->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const double a = std::strtod((*ours)[i].c_str(), nullptr), e = std::strtod(expected[i].c_str(), nullptr);
      ASSERT_LE(std::fabs(a - e), 1e-5 * std::max(1.0, std::fabs(e))) << "token " << i << ": conveyor " << (*ours)[i] << ", CNTK " << expected[i];
    }
  }
}

TEST(HtkGolden, CntkSpeechConfigWithDeserializersAndANetworkLoads) {
  // CNTK's own end-to-end LSTM config: `deserializers = ([HTKFeatureDeserializer]:[HTKMLFDeserializer])`
  // next to a BrainScript network definition (skipped).
  TempDir dir;
  std::string text = ReadFile(TestdataDir() + "/cntk/Speech/Configs/HTKDeserializers_LSTM_FullUtterance__cntk.cntk");
  for (size_t at; (at = text.find("$DataDir$")) != std::string::npos;) text.replace(at, 9, SpeechDir());
  for (size_t at; (at = text.find("$DeviceId$")) != std::string::npos;) text.replace(at, 10, "-1");
  for (size_t at; (at = text.find("$RunDir$")) != std::string::npos;) text.replace(at, 8, dir.path());
  auto config = LoadConfigFile(dir.Write("lstm.cntk", text));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->datasets.size(), 1u);
  const DatasetConfig& ds = config->datasets[0];
  ASSERT_EQ(ds.deserializers.size(), 2u);
  EXPECT_EQ(ds.deserializers[0].type, "HTKFeature");
  EXPECT_EQ(ds.deserializers[0].streams[0].dim, 363u);
  EXPECT_EQ(ds.deserializers[0].streams[0].scp_file, SpeechDir() + "/glob_0000.scp");
  EXPECT_EQ(ds.deserializers[1].type, "HTKMLF");
  EXPECT_EQ(ds.deserializers[1].streams[0].dim, 132u);
  EXPECT_EQ(ds.deserializers[1].streams[0].label_mapping_file, SpeechDir() + "/state.list");
  // Its features (Features/000000000.chunk) are not in tests/data: opening names the file.
  auto open = Dataset::Open(ds);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("000000000.chunk"), std::string::npos) << open.status();
}

std::vector<std::string> States(const std::string& path) {
  std::vector<std::string> out;
  for (const std::string& t : Tokens(ReadFile(path))) out.push_back(t);
  return out;
}

TEST(HtkGolden, BinaryMlfDecodesToTheTextMlf) {
  const std::vector<std::string> states = States(SpeechDir() + "/state.list");
  ASSERT_EQ(states.size(), 132u);
  Diagnostics diag(1, [](Severity, const std::string&) {});
  const std::string text = ReadFile(SpeechDir() + "/glob_0000.mlf");
  const std::string binary = ReadFile(SpeechDir() + "/mlf2.bin");
  auto t = ParseMlf(text, "glob_0000.mlf", states, 100000, &diag);
  auto b = ParseMlf(binary, "mlf2.bin", states, 100000, &diag);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(t->utterances.size(), 948u);
  ASSERT_EQ(b->utterances.size(), 948u);
  for (size_t i = 0; i < 948; ++i) {
    const MlfUtterance &x = t->utterances[i], &y = b->utterances[i];
    ASSERT_EQ(x.key, y.key) << i;
    ASSERT_EQ(x.frames, y.frames) << x.key;
    // The binary format stores runs of one state; the text may split a run over lines.
    std::vector<uint32_t> fx, fy;
    for (auto [c, n] : x.runs) fx.insert(fx.end(), n, c);
    for (auto [c, n] : y.runs) fy.insert(fy.end(), n, c);
    ASSERT_EQ(fx, fy) << x.key;
  }
  // The first utterance by hand: "0 100000 sil[2]" is frame 0, class of sil[2] in state.list.
  const MlfUtterance& u = t->utterances[0];
  EXPECT_EQ(u.key, "An4/71/71/cen5-fjam-b");
  EXPECT_EQ(u.frames, 368u);
  EXPECT_EQ(states[u.runs[0].first], "sil[2]");
  EXPECT_EQ(u.runs[0].second, 1u);
  EXPECT_EQ(states[u.runs[1].first], "sil[3]");
  EXPECT_EQ(u.runs[1].second, 54u);  // 100000 .. 5500000
}

std::string BigEndianHtk(int32_t samples, int32_t period, int16_t sample_bytes, uint16_t kind, const std::vector<float>& data) {
  std::string out;
  auto put32 = [&](uint32_t v) {
    v = __builtin_bswap32(v);
    out.append(reinterpret_cast<const char*>(&v), 4);
  };
  auto put16 = [&](uint16_t v) {
    v = __builtin_bswap16(v);
    out.append(reinterpret_cast<const char*>(&v), 2);
  };
  put32(static_cast<uint32_t>(samples));
  put32(static_cast<uint32_t>(period));
  put16(static_cast<uint16_t>(sample_bytes));
  put16(kind);
  for (float f : data) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    put32(u);
  }
  return out;
}

TEST(Htk, HeadersQualifiersAndTruncation) {
  const std::string f = BigEndianHtk(2, 100000, 8, 9 | 0100 | 0400, {1, 2, 3, 4});  // USER_E_D
  auto h = ParseHtkHeader(f, "f.htk");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->big_endian);
  EXPECT_EQ(h->dim, 2);
  EXPECT_EQ(h->frames, 2);
  for (size_t n = 0; n < f.size(); ++n) {
    auto t = ParseHtkHeader(f.substr(0, n), "f.htk");
    ASSERT_FALSE(t.ok()) << n;
    EXPECT_NE(t.status().message().find("f.htk"), std::string::npos);
  }
  EXPECT_FALSE(ParseHtkHeader(BigEndianHtk(1, 100000, 4, 9 | 040000, {1}), "v").ok());  // _V
  EXPECT_FALSE(ParseHtkHeader(BigEndianHtk(1, 100000, 3, 9, {1}), "odd").ok());       // 3-byte samples
  EXPECT_FALSE(ParseHtkHeader(BigEndianHtk(-1, 100000, 4, 9, {}), "neg").ok());
  // Little-endian files are recognised by their sample period.
  std::string le(12, '\0');
  const int32_t n = 1, period = 100000;
  const int16_t bytes = 4, kind = 9;
  std::memcpy(&le[0], &n, 4);
  std::memcpy(&le[4], &period, 4);
  std::memcpy(&le[8], &bytes, 2);
  std::memcpy(&le[10], &kind, 2);
  le.append("\0\0\x80\x3f", 4);  // 1.0f
  auto l = ParseHtkHeader(le, "le.htk");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->big_endian);
  EXPECT_EQ(l->period, 100000);
}

TEST(Htk, ScpForms) {
  auto a = ParseHtkScpLine("utt1.mfc=/data/x.htk[3,9]", "/scp");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->key, "utt1");
  EXPECT_EQ(a->path, "/data/x.htk");
  EXPECT_TRUE(a->has_range);
  EXPECT_EQ(a->first, 3);
  EXPECT_EQ(a->last, 9);
  auto b = ParseHtkScpLine("dir.v1/utt2.plp", "/scp");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->key, "dir.v1/utt2");
  EXPECT_FALSE(b->has_range);
  auto c = ParseHtkScpLine("u3=.../feats/u3.htk\r", "/corpus");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->path, "/corpus/feats/u3.htk");
  for (const char* bad : {"u=x[5,3]", "u=x[a,3]", "u=x[3]", "u=", "u=x[-1,3]"}) EXPECT_FALSE(ParseHtkScpLine(bad, "/").ok()) << bad;
  EXPECT_EQ(MlfKey("\"*/utt7.lab\""), "utt7");
  EXPECT_EQ(MlfKey("\"a/b.c/utt8.rec\""), "a/b.c/utt8");
}

TEST(Htk, CompressedFilesContextWindowsAndJoinByPattern) {
  TempDir dir;
  // _C: dim 2; A = (2, 4), B = (1, 0); frames x = (3, 8), (5, -4): values (x + B) / A.
  std::string c = BigEndianHtk(4 + 2, 100000, 4, 9 | 02000, {2, 4, 1, 0});
  for (int16_t x : {3, 8, 5, -4}) {
    const uint16_t be = __builtin_bswap16(static_cast<uint16_t>(x));
    c.append(reinterpret_cast<const char*>(&be), 2);
  }
  dir.Write("c.htk", c);
  dir.Write("f.scp", "uttA.mfc=.../c.htk[0,1]\n");
  dir.Write("l.mlf", "#!MLF!#\n\"*/uttA.lab\"\n0 100000 b\n100000 200000 a\n.\n");
  dir.Write("s.list", "a\nb\n");
  const std::string yaml = R"(
datasets:
  h:
    randomize: false
    deserializers:
      - type: HTKFeature
        input: {x: {scpFile: f.scp, dim: 6, contextWindow: 3}}
      - type: HTKMLF
        input: {y: {mlfFile: l.mlf, labelMappingFile: s.list, labelDim: 2, format: ids}}
)";
  const std::string path = dir.Write("c.yaml", yaml);
  auto config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  // Decoded into the chunk, and left in the file for the assembler (as the daemon reads).
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "left for the assembler" : "decoded into the chunk");
    ReadOptions ro;
    ro.compressed_in_place = in_place;
    auto dump = DumpDataset(config->datasets[0], ro);
    ASSERT_TRUE(dump.ok()) << dump.status();
    // Frame 0 = (2, 2), frame 1 = (3, -1); windows of 3 replicate the edges.
    EXPECT_EQ(*dump,
              "{\"epoch\":0,\"batch\":0,\"key\":\"uttA\",\"streams\":{\"x\":{\"dense\":[[2,2,2,2,3,-1],[2,2,3,-1,3,-1]]},"
              "\"y\":{\"ids\":[[1],[0]]}}}\n");
    // Without a context window (dim = the files' 2 values) frames decode as they are.
    std::string plain = yaml;
    plain.replace(plain.find("dim: 6, contextWindow: 3"), 24, "dim: 2");
    auto one = LoadConfigFile(dir.Write("c1.yaml", plain));
    ASSERT_TRUE(one.ok()) << one.status();
    auto dump1 = DumpDataset(one->datasets[0], ro);
    ASSERT_TRUE(dump1.ok()) << dump1.status();
    EXPECT_EQ(*dump1, "{\"epoch\":0,\"batch\":0,\"key\":\"uttA\",\"streams\":{\"x\":{\"dense\":[[2,2],[3,-1]]},\"y\":{\"ids\":[[1],[0]]}}}\n");
  }
}

// A feature file rewritten in place while its dataset is open (features extracted again over
// the same paths): the chunk that reads it is DataLoss naming the file, not the new values.
TEST(Htk, AFeatureFileRewrittenInPlaceWhileOpenIsAnError) {
  TempDir dir;
  std::string scp;
  for (int u = 0; u < 40; ++u) {
    std::vector<float> v(50 * 2);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(u * 1000 + i);
    dir.Write("u" + std::to_string(u) + ".htk", BigEndianHtk(50, 100000, 8, 9, v));
    scp += "u" + std::to_string(u) + "=u" + std::to_string(u) + ".htk\n";
  }
  dir.Write("f.scp", scp);
  const std::string path = dir.Write("h.yaml", R"(
datasets:
  h:
    randomize: false
    deserializers:
      - type: HTKFeature
        chunkSizeInBytes: 2048
        input: {x: {scpFile: f.scp, dim: 2}}
)");
  auto config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(config->datasets[0]);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const uint64_t chunks = (*ds)->index().chunks.size();
  ASSERT_GE(chunks, 4u);
  ASSERT_TRUE((*ds)->ParseChunk(0).ok());
  const std::string last = dir.path() + "/u39.htk";
  ASSERT_EQ(RewriteInPlace(last, BigEndianHtk(50, 100000, 8, 9, std::vector<float>(50 * 2, 7.0f))),
            absl::OkStatus());
  ASSERT_TRUE((*ds)->ParseChunk(0).ok());  // (its files unchanged)
  auto chunk = (*ds)->ParseChunk(chunks - 1);
  ASSERT_FALSE(chunk.ok());
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kDataLoss) << chunk.status();
  EXPECT_NE(chunk.status().message().find(last + ": the file was changed after it was opened"), std::string::npos)
      << chunk.status();
  // A chunk of many files checks a few of them at each parse (a stat each costs a third of a
  // small file's decode): every file extracted again is caught at once.
  std::string whole = ReadFile(path);
  whole.replace(whole.find("2048"), 4, "1048576");
  auto big = LoadConfigFile(dir.Write("big.yaml", whole));
  ASSERT_TRUE(big.ok()) << big.status();
  auto one = Dataset::Open(big->datasets[0]);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ((*one)->index().chunks.size(), 1u);
  ASSERT_TRUE((*one)->ParseChunk(0).ok());
  for (int u = 0; u < 40; ++u) {  // each file extracted again: other values, the same size
    ASSERT_EQ(RewriteInPlace(dir.path() + "/u" + std::to_string(u) + ".htk",
                               BigEndianHtk(50, 100000, 8, 9, std::vector<float>(50 * 2, 3.0f + u))), absl::OkStatus());
  }
  auto again = (*one)->ParseChunk(0);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("the file was changed after it was opened"), std::string::npos)
      << again.status();
}

// A feature file cut short while a dataset that leaves frames in their files reads it (the
// daemon's way): a batch of utterances located before the cut is DataLoss naming the file,
// not a SIGBUS, and the dataset stays failed.
TEST(Htk, AFeatureFileCutShortWhileFramesAreReadInPlaceIsAnErrorNotACrash) {
  TempDir dir;
  const int utterances = 40, frames = 100, d = 20;
  std::vector<float> v(static_cast<size_t>(utterances) * frames * d);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000);
  const std::string path = dir.Write("f.htk", BigEndianHtk(utterances * frames, 100000, 4 * d, 9, v));
  std::string scp;
  for (int u = 0; u < utterances; ++u) absl::StrAppend(&scp, "u", u, "=.../f.htk[", u * frames, ",", u * frames + frames - 1, "]\n");
  dir.Write("f.scp", scp);
  auto config = LoadConfigFile(dir.Write("h.yaml", absl::StrCat(
      "datasets:\n  h:\n    randomize: false\n    deserializers:\n      - type: HTKFeature\n"
      "        input: {x: {scpFile: f.scp, dim: ", 3 * d, ", contextWindow: 3}}\n")));
  ASSERT_TRUE(config.ok()) << config.status();
  DatasetOpenOptions oo;
  oo.compressed_in_place = true;
  auto ds = Dataset::Open(config->datasets[0], oo);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = frames;  // one utterance a batch
  auto loader = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(loader.ok()) << loader.status();
  Batch b;
  auto more = (*loader)->Next(&b);
  ASSERT_TRUE(more.ok() && *more) << more.status();
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);  // utterance 0's first frames stay
  absl::Status st;
  for (int i = 0; i < 3 && st.ok(); ++i) {
    more = (*loader)->Next(&b);
    st = more.status();
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(path + ": the file was cut short after it was opened"), std::string::npos) << st;
  EXPECT_EQ((*ds)->CheckReads().code(), absl::StatusCode::kDataLoss);
}

// Uncompressed big-endian frames decode in one pass per utterance (vectorized swap; in
// blocks when widened to double): every value exact, in float and double, with and without
// a context window, on utterances longer than the widening block; decoded into the chunk, or
// left in the file and decoded, windows and all, as the batch is assembled.
TEST(Htk, UncompressedFramesDecodeAlikeInFloatAndDouble) {
  TempDir dir;
  const int frames = 300, d = 3;
  std::vector<float> values(frames * d);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.25f - 3;
  dir.Write("f.htk", BigEndianHtk(frames, 100000, 4 * d, 9, values));
  // c: an utterance shorter than the widest window (every frame of it is at an edge).
  dir.Write("f.scp", "a=.../f.htk[0,199]\nb=.../f.htk[200,299]\nc=.../f.htk[5,7]\n");
  for (auto [precision, in_place] : {std::make_pair("float", false), std::make_pair("double", false),
                                     std::make_pair("float", true), std::make_pair("double", true)}) {
    // No window, symmetric windows as one number, and lopsided ones as [left, right].
    for (auto [left, right] : {std::make_pair(0, 0), std::make_pair(1, 1), std::make_pair(5, 5),
                               std::make_pair(2, 0), std::make_pair(1, 3)}) {
      const int window = left + 1 + right;
      SCOPED_TRACE(absl::StrCat(precision, " window [", left, ", ", right, "]",
                                in_place ? ", left for the assembler" : ", decoded into the chunk"));
      const std::string context = window == 1       ? ""
                                  : left == right ? absl::StrCat(", contextWindow: ", window)
                                                  : absl::StrCat(", contextWindow: [", left, ", ", right, "]");
      auto config = LoadConfigFile(dir.Write("c.yaml", absl::StrCat(
          "datasets:\n  h:\n    randomize: false\n    precision: ", precision, "\n    deserializers:\n"
          "      - type: HTKFeature\n        input: {x: {scpFile: f.scp, dim: ", d * window, context, "}}\n")));
      ASSERT_TRUE(config.ok()) << config.status();
      ReadOptions ro;
      ro.compressed_in_place = in_place;
      auto dump = DumpDataset(config->datasets[0], ro);
      ASSERT_TRUE(dump.ok()) << dump.status();
      std::string want;
      for (auto [key, first, last] :
           {std::make_tuple("a", 0, 199), std::make_tuple("b", 200, 299), std::make_tuple("c", 5, 7)}) {
        absl::StrAppend(&want, "{\"epoch\":0,\"batch\":0,\"key\":\"", key, "\",\"streams\":{\"x\":{\"dense\":[");
        for (int t = first; t <= last; ++t) {
          want += t > first ? ",[" : "[";
          bool comma = false;
          for (int k = t - left; k <= t + right; ++k) {
            const int f = std::min(std::max(k, first), last);
            for (int j = 0; j < d; ++j) {
              absl::StrAppend(&want, comma ? "," : "", values[f * d + j]);
              comma = true;
            }
          }
          want += "]";
        }
        want += "]}}}\n";
      }
      EXPECT_EQ(*dump, want);
    }
  }
}

// A context window given on one side only (possible through the library, not a config: -1 is
// "infer it") is refused, not read as a window of left + 1 - 1 frames.
TEST(Htk, AContextWindowGivenOnOneSideIsRefused) {
  TempDir dir;
  dir.Write("f.htk", BigEndianHtk(4, 100000, 4 * 2, 9, std::vector<float>(8, 1.0f)));
  dir.Write("f.scp", "a=.../f.htk\n");
  auto config = LoadConfigFile(dir.Write("c.yaml",
      "datasets:\n  h:\n    deserializers:\n      - type: HTKFeature\n        input: {x: {scpFile: f.scp, dim: 10, contextWindow: [2, 2]}}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(Dataset::Open(config->datasets[0]).ok());
  for (auto [left, right] : {std::make_pair(2, -1), std::make_pair(-1, 2)}) {
    DatasetConfig ds = config->datasets[0];
    ds.deserializers[0].streams[0].context_left = left;
    ds.deserializers[0].streams[0].context_right = right;
    auto open = Dataset::Open(ds);
    ASSERT_FALSE(open.ok()) << left << ", " << right;
    EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(open.status().message().find("give both"), std::string_view::npos) << open.status();
  }
}

// The daemon and the CLI open datasets with compressed_in_place: an HTK chunk then holds only
// where each utterance's frames lie, and the assembler decodes them, building the context
// windows as it writes the batch. Every batch must be the one decoding into the chunk gives:
// big- and little-endian float32 files and a _C one, whole files and frame ranges (one frame,
// two, shorter than the window), no window, symmetric and lopsided ones, float and double,
// utterances and frames randomized (frames by request and by frameMode: true), truncated BPTT,
// a rank of two, narrowed to float16.
TEST(Htk, FramesLeftForTheAssemblerDeliverTheSameBatches) {
  TempDir dir;
  const int d = 5;
  auto values = [&](int frames, int salt) {
    std::vector<float> v(static_cast<size_t>(frames) * d);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37 + salt) % 1009) * 0.125f - 60.0f;
    return v;
  };
  dir.Write("be.htk", BigEndianHtk(300, 100000, 4 * d, 9, values(300, 1)));
  // Little endian: the same header fields, unswapped (told apart by the smaller period).
  std::string le;
  for (int32_t v : {120, 100000}) le.append(reinterpret_cast<const char*>(&v), 4);
  const int16_t sample_bytes = 4 * d, kind = 9;
  le.append(reinterpret_cast<const char*>(&sample_bytes), 2);
  le.append(reinterpret_cast<const char*>(&kind), 2);
  for (float f : values(120, 2)) le.append(reinterpret_cast<const char*>(&f), 4);
  dir.Write("le.htk", le);
  // _C: A and B (d floats each, the room of 4 samples of d int16), then 80 frames of int16.
  std::vector<float> ab;
  for (int j = 0; j < d; ++j) ab.push_back(1.5f + j);
  for (int j = 0; j < d; ++j) ab.push_back(-3.0f + 2 * j);
  std::string c = BigEndianHtk(4 + 80, 100000, 2 * d, 9 | 02000, ab);
  for (int i = 0; i < 80 * d; ++i) {
    const uint16_t be = __builtin_bswap16(static_cast<uint16_t>(static_cast<int16_t>((i * 131) % 20000 - 10000)));
    c.append(reinterpret_cast<const char*>(&be), 2);
  }
  dir.Write("c.htk", c);
  dir.Write("f.scp",
            "a=.../be.htk[0,99]\nb=.../be.htk[100,101]\nc=.../be.htk[102,299]\nd=.../le.htk\ne=.../le.htk[3,3]\n"
            "f=.../c.htk\ng=.../c.htk[10,40]\nh=.../be.htk[7,9]\n");
  for (auto [left, right] : {std::make_pair(0, 0), std::make_pair(5, 5), std::make_pair(2, 0), std::make_pair(1, 3)}) {
    for (const char* precision : {"float", "double"}) {
      const int window = left + 1 + right;
      auto config = LoadConfigFile(dir.Write("c.yaml", absl::StrCat(
          "datasets:\n  h:\n    precision: ", precision, "\n    deserializers:\n"
          "      - type: HTKFeature\n        chunkSizeInBytes: 2000\n"
          "        input: {x: {scpFile: f.scp, dim: ", d * window, ", contextWindow: [", left, ", ", right, "]}}\n")));
      ASSERT_TRUE(config.ok()) << config.status();
      DatasetConfig frames_config = config->datasets[0];
      frames_config.frame_mode = true;
      for (int mode = 0; mode < 6; ++mode) {
        if (mode == 4 && std::string(precision) == "double") continue;  // float16 narrows float datasets
        SCOPED_TRACE(absl::StrCat("window [", left, ", ", right, "] ", precision, " mode ", mode));
        ReadOptions ro;
        ro.minibatch_size = 150;
        ro.epochs = 2;
        ro.request.randomize = true;
        ro.request.seed = 9;
        if (mode == 1) {  // frames, randomized
          ro.request.frame_mode = true;
          ro.minibatch_size = 64;
        }
        if (mode == 2) {  // truncated BPTT
          ro.request.truncation = 7;
          ro.request.parallel = 3;
        }
        if (mode == 3) {  // rank 1 of 2, in file order
          ro.request.randomize = false;
          ro.request.rank = 1;
          ro.request.world = 2;
        }
        if (mode == 4) ro.request.value_dtypes["x"] = DType::kFloat16;
        if (mode == 5) ro.minibatch_size = 100;  // frames by the configuration (frameMode: true)
        ro.threads = 1 + mode % 3;
        const DatasetConfig& dc = mode == 5 ? frames_config : config->datasets[0];
        auto decoded = DumpDataset(dc, ro);
        ASSERT_TRUE(decoded.ok()) << decoded.status();
        ro.compressed_in_place = true;
        auto kept = DumpDataset(dc, ro);
        ASSERT_TRUE(kept.ok()) << kept.status();
        EXPECT_GT(decoded->size(), 1000u);
        EXPECT_TRUE(*kept == *decoded) << "first difference at byte "
                                       << std::mismatch(kept->begin(), kept->end(), decoded->begin(), decoded->end()).first -
                                              kept->begin();
      }
    }
  }
  // The chunks really hold no values (else the comparison above proves nothing), and any
  // rows and columns of a payload decode to those values: here every row's columns from 3 on
  // of 11-frame windows (they cut frames), against the chunk decoded at parse time.
  auto config = LoadConfigFile(dir.Write("w.yaml", absl::StrCat(
      "datasets:\n  h:\n    randomize: false\n    deserializers:\n      - type: HTKFeature\n"
      "        input: {x: {scpFile: f.scp, dim: ", d * 11, ", contextWindow: 11}}\n")));
  ASSERT_TRUE(config.ok()) << config.status();
  DatasetOpenOptions oo;
  oo.compressed_in_place = true;
  {  // Frames too (by the configuration, or `reads_frames` for a request's frame mode).
    DatasetConfig frames = config->datasets[0];
    frames.frame_mode = true;
    auto by_config = Dataset::Open(frames, oo);
    DatasetOpenOptions by_request = oo;
    by_request.reads_frames = true;
    auto requested = Dataset::Open(config->datasets[0], by_request);
    ASSERT_TRUE(by_config.ok() && requested.ok());
    for (const auto* ds : {&*by_config, &*requested}) {
      auto chunk = (*ds)->SharedChunk(0);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      EXPECT_EQ((*chunk)->streams[0].compressed.size(), 8u);
      EXPECT_TRUE((*chunk)->streams[0].values_f32.empty());
    }
  }
  auto kept = Dataset::Open(config->datasets[0], oo);
  auto decoded = Dataset::Open(config->datasets[0]);
  ASSERT_TRUE(kept.ok() && decoded.ok());
  ASSERT_EQ((*kept)->index().chunks.size(), 1u);
  auto kc = (*kept)->SharedChunk(0);
  auto dc = (*decoded)->SharedChunk(0);
  ASSERT_TRUE(kc.ok() && dc.ok());
  const ParsedStream &k = (*kc)->streams[0], &v = (*dc)->streams[0];
  ASSERT_EQ(k.compressed.size(), 8u);
  EXPECT_TRUE(k.values_f32.empty());
  ASSERT_EQ(v.values_f32.size(), (300u + 120 + 1 + 80 + 31 + 3) * 11 * d);  // a-c, d, e, f, g, h
  for (uint32_t slot = 0; slot < 8; ++slot) {
    const uint64_t rows = k.num_samples(slot), cols = 11 * d - 3;
    ASSERT_EQ(rows, v.num_samples(slot));
    std::vector<float> got(rows * cols);
    CompressedWindow w;
    w.row0 = 0;
    w.rows = static_cast<int64_t>(rows);
    w.col0 = 3;
    w.cols = static_cast<int64_t>(cols);
    DecodeCompressed(k.compressed[slot], w, got.data());
    for (uint64_t r = 0; r < rows; ++r) {
      const float* want = v.values_f32.data() + (v.sequence_begin[slot] + r) * 11 * d + 3;
      ASSERT_EQ(std::memcmp(got.data() + r * cols, want, cols * 4), 0) << "utterance " << slot << " row " << r;
    }
  }
}

// The loader hands a caller's previous batch plan back to the next PlanBatch (its arrays and
// its pieces' name strings reused): a caller that passes the same Batch to every Next() must
// get exactly what one passing a fresh Batch gets. Frame mode, so that each frame is a piece
// carrying its utterance's name; names short (in the string itself) and long (on the heap),
// batches that cut utterances anywhere, and a short last batch.
TEST(Htk, AReusedBatchGetsThePlanAFreshOneWould) {
  TempDir dir;
  const int frames = 40, d = 2;
  std::vector<float> values(frames * d);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  dir.Write("f.htk", BigEndianHtk(frames, 100000, 4 * d, 9, values));
  dir.Write("f.scp",
            "a=.../f.htk[0,6]\n"
            "an_utterance_name_well_past_fifteen_characters=.../f.htk[7,19]\n"
            "b=.../f.htk[20,22]\n"
            "another_long_utterance_name_of_a_second_length_xyz=.../f.htk[23,39]\n");
  auto config = LoadConfigFile(dir.Write("c.yaml",
      "datasets:\n  h:\n    randomize: false\n    frameMode: true\n    deserializers:\n"
      "      - type: HTKFeature\n        input: {x: {scpFile: f.scp, dim: 2}}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(config->datasets[0]);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 9;
  lo.planner.epochs = 2;
  lo.planner.randomizer.frame_mode = true;  // (what the CLI and the daemon take from frameMode)
  struct Seen {
    std::vector<std::string> pieces;  // every field of every piece, as text
    std::vector<uint32_t> counts;
    std::string bytes;
  };
  auto read = [&](bool reuse) {
    std::vector<Seen> out;
    auto loader = Loader::Create(ds->get(), cpu.get(), lo);
    EXPECT_TRUE(loader.ok()) << loader.status();
    if (!loader.ok()) return out;
    Batch kept;
    while (true) {
      Batch fresh;
      Batch& b = reuse ? kept : fresh;
      auto more = (*loader)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      Seen seen;
      for (const PlacedPiece& p : b.plan.pieces) {
        seen.pieces.push_back(absl::StrCat(p.key, "/", p.name, "/", p.frame, "/", p.row, "/", p.t0, "/", p.sample_begin,
                                           "/", p.truncated, "/", p.longest));
      }
      seen.counts = b.plan.counts;
      seen.bytes.assign(reinterpret_cast<const char*>(b.bytes.data()), b.bytes.size());
      EXPECT_TRUE(b.plan.entries.empty());
      out.push_back(std::move(seen));
    }
    return out;
  };
  const std::vector<Seen> fresh = read(false), reused = read(true);
  ASSERT_EQ(fresh.size(), 10u);  // 2 epochs of 40 frames in batches of 9: 4 of 9 and one of 4
  ASSERT_EQ(reused.size(), fresh.size());
  EXPECT_EQ(fresh[4].pieces.size(), 4u);
  EXPECT_EQ(fresh[1].pieces[0], "1/an_utterance_name_well_past_fifteen_characters/2/0/0/2/0/1");
  for (size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_EQ(reused[i].pieces, fresh[i].pieces) << "batch " << i;
    EXPECT_EQ(reused[i].counts, fresh[i].counts) << "batch " << i;
    EXPECT_EQ(reused[i].bytes, fresh[i].bytes) << "batch " << i;
  }
}

// A context window repeats every frame window-fold in the parsed chunk: chunks are cut by
// their parsed size (input x window), not their input, so a window of 5 gives 5x the chunks.
TEST(Htk, ContextWindowsCutChunksByTheirParsedSize) {
  TempDir dir;
  std::vector<float> values(20 * 10 * 2);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  dir.Write("f.htk", BigEndianHtk(200, 100000, 8, 9, values));
  std::string scp;
  for (int u = 0; u < 20; ++u) scp += "u" + std::to_string(u) + "=.../f.htk[" + std::to_string(10 * u) + "," + std::to_string(10 * u + 9) + "]\n";
  dir.Write("f.scp", scp);
  auto chunks = [&](const std::string& input) -> uint64_t {
    auto config = LoadConfigFile(dir.Write("c.yaml", "datasets:\n  h:\n    deserializers:\n      - type: HTKFeature\n"
                                                      "        chunkSizeInBytes: 400\n        input: {x: {scpFile: f.scp, " + input + "}}\n"));
    EXPECT_TRUE(config.ok()) << config.status();
    auto ds = Dataset::Open(config->datasets[0]);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return ds.ok() ? (*ds)->index().chunks.size() : 0;
  };
  EXPECT_EQ(chunks("dim: 2"), 4u);                     // 80 bytes an utterance, 5 a chunk
  EXPECT_EQ(chunks("dim: 10, contextWindow: 5"), 20u);  // 400 parsed bytes an utterance
}

TEST(Htk, MlfErrorsAndSkippedUtterances) {
  Diagnostics diag(1, [](Severity, const std::string&) {});
  const std::vector<std::string> states = {"a", "b"};
  EXPECT_FALSE(ParseMlf("\"x\"\n0 1 a\n.\n", "m", states, 100000, &diag).ok());            // no header
  EXPECT_FALSE(ParseMlf("#!MLF!#\n\"x\"\n0 1 c\n.\n", "m", states, 100000, &diag).ok());   // unknown label
  EXPECT_FALSE(ParseMlf("#!MLF!#\n\"x\"\n0 1 a\n", "m", states, 100000, &diag).ok());      // no '.'
  auto bad = ParseMlf("#!MLF!#\n\"x\"\n0 1 a\n5 6 a\n.\n", "m", states, 100000, &diag);
  ASSERT_FALSE(ParseMlf("#!MLF!#\n\"x\"\n0 z a\n.\n", "m.mlf", states, 100000, &diag).ok());
  const std::string msg(ParseMlf("#!MLF!#\n\"x\"\n0 z a\n.\n", "m.mlf", states, 100000, &diag).status().message());
  EXPECT_NE(msg.find("m.mlf:3:"), std::string::npos) << msg;
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->utterances.size(), 0u);  // a gap: the utterance is dropped (warned)
  EXPECT_EQ(bad->dropped, 1u);
  // Frame numbers when a range is shorter than a frame's worth of 100 ns units.
  auto frames = ParseMlf("#!MLF!#\n\"x\"\n0 3 a\n3 5 b\n.\n#!MLF!#\n\"y\"\n0 200000 b\n.\n", "m", states, 100000, &diag);
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->utterances.size(), 2u);
  EXPECT_EQ(frames->utterances[0].frames, 5u);
  EXPECT_EQ(frames->utterances[1].frames, 2u);
  // Every truncation of the binary MLF ends in an error or a prefix, never a crash.
  const std::string binary = ReadFile(SpeechDir() + "/mlf2.bin").substr(0, 4000);
  for (size_t n = 0; n < binary.size(); n += 3) (void)ParseMlf(binary.substr(0, n), "b", {}, 100000, &diag);
}

}  // namespace
}  // namespace conveyor::testing
