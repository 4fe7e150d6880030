// Configuration loading: YAML, JSON and CNTK BrainScript reader blocks as CNTK's documentation
// writes them.
#include <string>

#include "common/config/config_loader.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(Config, ReadsTheDesignExample) {
  auto c = ParseConfig(R"(listen: 127.0.0.1:7070
datasets:
  train:
    randomize: true
    randomizationWindow: 128
    randomizationSeed: 3
    maxErrors: 5
    traceLevel: 2
    cacheIndex: true
    precision: double
    deserializers:
      - type: CNTKTextFormat
        file: train.ctf
        skipSequenceIds: false
        chunkSizeInBytes: 1024
        input:
          features: {dim: 784, format: dense}
          labels:   {dim: 10, format: sparse, alias: l, definesMBSize: true}
)", "c.yaml", "/data/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "127.0.0.1:7070");
  const DatasetConfig* d = c->Find("train");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->randomize);
  EXPECT_EQ(*d->randomization_window, 128u);
  EXPECT_EQ(d->randomization_seed, 3u);
  EXPECT_EQ(d->max_errors, 5u);
  EXPECT_EQ(d->trace_level, 2);
  EXPECT_TRUE(d->cache_index);
  EXPECT_EQ(d->precision, Precision::kDouble);
  ASSERT_EQ(d->deserializers.size(), 1u);
  EXPECT_EQ(d->deserializers[0].file, "/data/train.ctf");
  EXPECT_EQ(d->deserializers[0].chunk_size_in_bytes, 1024u);
  ASSERT_EQ(d->deserializers[0].streams.size(), 2u);
  EXPECT_EQ(d->deserializers[0].streams[0].alias, "features");
  EXPECT_EQ(d->deserializers[0].streams[1].alias, "l");
  EXPECT_EQ(d->deserializers[0].streams[1].format, StreamFormat::kSparse);
  EXPECT_TRUE(d->deserializers[0].streams[1].defines_mb_size);
}

TEST(Config, JsonIsAccepted) {
  auto c = ParseConfig(R"({"datasets": {"d": {"deserializers": [{"type": "CNTKTextFormat", "file": "/x.ctf",
      "input": {"a": {"dim": 3, "format": "dense"}}}]}}})", "c.json", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->datasets[0].deserializers[0].streams[0].dim, 3u);
}

TEST(Config, ReadsTheSeedSimpleReaderBlock) {
  auto c = ParseConfig(R"(...
reader = [
    readerType = "CNTKTextFormatReader"
    file = "c:\mydata\SampleInput.txt" # See the second example for Linux path example

    # IMPORTANT!
    # All inputs are grouped within "input" sub-section.
    input = [
        A = [
            dim = 5
            format = "dense"
        ]
        B = [
            dim = 1000000
            format = "sparse"
        ]
        C = [
            dim = 1
            format = "dense"
        ]
    ]
]
# the rest of the cntk config ...
)", "r.cntk", "");
  ASSERT_FALSE(c.ok());  // the documentation's `...` line is prose, not BrainScript
  auto ok = ParseConfig(R"(reader = [
    readerType = "CNTKTextFormatReader"
    file = "c:\mydata\SampleInput.txt" # See the second example for Linux path example
    input = [
        A = [
            dim = 5
            format = "dense"
        ]
        B = [
            dim = 1000000
            format = "sparse"
        ]
    ]
]
)", "r.cntk", "");
  ASSERT_TRUE(ok.ok()) << ok.status();
  const DatasetConfig* d = ok->Find("reader");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->randomize);  // CNTK's default
  EXPECT_EQ(d->deserializers[0].file, "c:\\mydata\\SampleInput.txt");
  EXPECT_EQ(d->deserializers[0].streams[1].dim, 1000000u);
}

TEST(Config, ReadsTheSeedExtendedAndCompositeBlocks) {
  auto c = ParseConfig(R"(precision="double"

reader = [
    readerType = "CNTKTextFormatReader"
    file = "/home/mydata/SampleInput.txt"
    randomize = true
    randomizationWindow = 30
    skipSequenceIds = false
    maxErrors = 100
    traceLevel = 2
    chunkSizeInBytes = 1024
    keepDataInMemory = true
    frameMode = false
    input = [
        Some_very_long_input_name = [
            alias = "a"
            dim = 3
            format = "dense"
        ]
        Some_other_also_very_long_input_name = [
            alias = "b"
            dim = 2
            format = "dense"
        ]
    ]
]
)", "e.cntk", "");
  ASSERT_TRUE(c.ok()) << c.status();
  const DatasetConfig& d = c->datasets[0];
  EXPECT_EQ(d.precision, Precision::kDouble);
  EXPECT_EQ(*d.randomization_window, 30u);
  EXPECT_EQ(d.EffectiveMaxErrors(), 100u);
  EXPECT_EQ(d.EffectiveTraceLevel(), 2);
  EXPECT_TRUE(d.keep_data_in_memory);
  EXPECT_EQ(d.deserializers[0].chunk_size_in_bytes, 1024u);
  EXPECT_EQ(d.deserializers[0].streams[0].alias, "a");

  auto composite = ParseConfig(R"(reader = {
        verbosity = 0 ;
        randomize = true;
        randomizationWindow=30
        deserializers = ({
            type = "CNTKTextFormatDeserializer" ; module = "CNTKTextFormatReader"
            file = "/home/mydata/SampleInput.txt" # See the first example for Windows style path example
            maxErrors = 100
            skipSequenceIds = false
            traceLevel = 2
            input = {
                qu1fea = {alias = "qui"; dim = 95589; format = "sparse"}
                qu2fea = {alias = "quj"; dim = 95589; format = "sparse"}
                pairweight = {alias = "wij"; dim = 1; format = "dense"}
            }
        })
    }
)", "c.cntk", "");
  ASSERT_TRUE(composite.ok()) << composite.status();
  const DatasetConfig& cd = composite->datasets[0];
  EXPECT_EQ(cd.name, "reader");
  ASSERT_EQ(cd.deserializers.size(), 1u);
  EXPECT_EQ(cd.EffectiveMaxErrors(), 100u);
  ASSERT_EQ(cd.deserializers[0].streams.size(), 3u);
  EXPECT_EQ(cd.deserializers[0].streams[2].name, "pairweight");
  EXPECT_EQ(cd.deserializers[0].streams[2].alias, "wij");
}

// The documented HTKMLFReader block ("BrainScript HTKMLF Reader"): frames by default,
// utterances when frameMode is false or truncated BPTT is asked for.
TEST(Config, HtkMlfReaderBlocksReadFramesUnlessToldOtherwise) {
  auto frame_mode = [](const std::string& extra) {
    auto c = ParseConfig(std::string(R"(
reader = [
    readerType = "HTKMLFReader"
    readMethod = "blockRandomize"
    miniBatchMode = "partial"
    randomize = "17280000"
)") + extra + R"(
    features = [
        dim = 792
        scpFile = "TIMIT.train.scp.fbank.fullpath"
    ]
    labels = [
        mlfFile = "TIMIT.train.align_cistate.mlf.cntk"
        labelDim = 183
        labelMappingFile = "TIMIT.statelist"
    ]
]
)", "reader.cntk", "/data");
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {  // randomize = "17280000": a window of that many samples
      EXPECT_TRUE(c->datasets[0].randomize);
      EXPECT_TRUE(c->datasets[0].sample_based_randomization_window);
      EXPECT_EQ(c->datasets[0].randomization_window.value_or(0), 17280000u);
    }
    return c.ok() && c->datasets[0].frame_mode;
  };
  EXPECT_TRUE(frame_mode(""));
  EXPECT_TRUE(frame_mode("frameMode = true"));
  EXPECT_FALSE(frame_mode("frameMode = false"));
  EXPECT_FALSE(frame_mode("truncated = true\ntruncationLength = 20"));
}

TEST(Config, ServerChoosesTheAssemblerAndDevice) {
  auto c = ParseConfig("server: {assembler: CUDA, cudaDevice: 2}\ndatasets:\n  d:\n    file: /x.ctf\n"
                       "    input: {a: {dim: 1, format: dense}}\n", "s.yaml", "/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.assembler, "cuda");
  EXPECT_EQ(c->server.cuda_device, 2);
  auto plain = ParseConfig("datasets:\n  d:\n    file: /x.ctf\n    input: {a: {dim: 1, format: dense}}\n", "s.yaml", "/");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->server.assembler, "");  // the daemon's default
  EXPECT_EQ(plain->server.cuda_device, -1);
  auto bad = ParseConfig("server: {assembler: tpu}\ndatasets:\n  d:\n    file: /x.ctf\n    input: {a: {dim: 1, format: dense}}\n",
                         "s.yaml", "/");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("s.yaml:1:"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("expected assembler cpu or cuda, found 'tpu'"), std::string::npos) << bad.status();
}

TEST(Config, ServerSizesItsMemoryPools) {
  const std::string data = "datasets:\n  d:\n    file: /x.ctf\n    input: {a: {dim: 1, format: dense}}\n";
  auto c = ParseConfig("server: {stagingBytes: 67108864, minSlotBytes: 4096, slotHeadroom: 1.5}\n" + data, "s.yaml", "/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.staging_bytes, uint64_t{64} << 20);
  EXPECT_EQ(c->server.min_slot_bytes, 4096u);
  EXPECT_EQ(c->server.slot_headroom, 1.5);
  auto plain = ParseConfig(data, "s.yaml", "/");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->server.staging_bytes, 0u);  // the daemon's defaults
  EXPECT_EQ(plain->server.slot_headroom, 0.0);
  auto headroom = ParseConfig("server: {slotHeadroom: 0.5}\n" + data, "s.yaml", "/");
  ASSERT_FALSE(headroom.ok());
  EXPECT_NE(headroom.status().message().find("s.yaml:1:24: expected a number from 1 to 16 for 'slotHeadroom', found '0.5'"),
            std::string::npos)
      << headroom.status();
  auto tiny = ParseConfig("server: {stagingBytes: 10}\n" + data, "s.yaml", "/");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("'stagingBytes' must be between 65536 and"), std::string::npos) << tiny.status();
}

TEST(Config, ResolvesDollarReferencesCaseInsensitively) {
  auto c = ParseConfig("defMbSize=true\nX = [ reader = [ file = \"f\"\n input = [ a = [ dim = 1; format = \"dense\"; definesMbSize=$defMBSize$ ] ] ] ]\n",
                       "x.cntk", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->Find("X")->deserializers[0].streams[0].defines_mb_size);
}

TEST(Config, ErrorsNameFileLineAndColumn) {
  auto bad_dim = ParseConfig("datasets:\n  d:\n    deserializers:\n      - file: x\n        input: {a: {dim: zero, format: dense}}\n", "c.yaml", "");
  ASSERT_FALSE(bad_dim.ok());
  EXPECT_EQ(bad_dim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_dim.status().message().find("c.yaml:5:"), std::string::npos) << bad_dim.status();
  EXPECT_NE(bad_dim.status().message().find("expected a non-negative integer for 'dim'"), std::string::npos);

  auto typo = ParseConfig("datasets:\n  d:\n    randomise: false\n    deserializers: [{file: x, input: {a: {dim: 1, format: dense}}}]\n", "c.yaml", "");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("c.yaml:3:16: unknown key 'randomise'"), std::string::npos) << typo.status();

  auto format = ParseConfig("datasets:\n  d:\n    deserializers: [{file: x, input: {a: {dim: 1, format: dence}}}]\n", "c.yaml", "");
  ASSERT_FALSE(format.ok());
  EXPECT_NE(format.status().message().find("expected format dense, sparse or ids"), std::string::npos);
}

TEST(Config, ADeserializerKeyBesideDeserializersSaysWhereItGoes) {
  auto misplaced = ParseConfig(
      "datasets:\n  d:\n    chunkSizeInBytes: 4000\n    deserializers: [{file: x, input: {a: {dim: 1, format: dense}}}]\n",
      "c.yaml", "");
  ASSERT_FALSE(misplaced.ok());
  EXPECT_NE(misplaced.status().message().find("c.yaml:3:23: dataset 'd' has 'deserializers', and 'chunkSizeInBytes' is a "
                                              "deserializer's key: move it into a deserializer's block"),
            std::string::npos)
      << misplaced.status();
}

TEST(Config, RefusesDuplicateAliasesAndTwoDefiningStreams) {
  auto dup = ParseConfig("datasets:\n  d:\n    deserializers: [{file: x, input: {a: {dim: 1, format: dense, alias: z}, b: {dim: 1, format: dense, alias: z}}}]\n", "c.yaml", "");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("alias 'z' is used by two inputs"), std::string::npos);
  auto two = ParseConfig("datasets:\n  d:\n    deserializers: [{file: x, input: {a: {dim: 1, format: dense, definesMBSize: true}, b: {dim: 1, format: dense, definesMBSize: true}}}]\n", "c.yaml", "");
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("definesMBSize"), std::string::npos);
}

TEST(Config, RefusesDeepNestingAndHugeFiles) {
  std::string deep = "datasets: " + std::string(100, '[') + std::string(100, ']');
  EXPECT_FALSE(ParseConfig(deep, "c.yaml", "").ok());
  EXPECT_FALSE(ParseConfig(std::string(kMaxConfigBytes + 1, ' '), "c.yaml", "").ok());
}

TEST(Config, BrainScriptSyntaxErrorsNameTheLine) {
  auto c = ParseConfig("reader = [\n  file = \"x\"\n  input = [ a = [ dim = 1 format = \"dense\" ]\n", "r.cntk", "");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("r.cntk:4:1: expected ']' before the end of the file"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

// Every key the suggestions offer is one the converter takes (the lists and the parsing code
// are written apart): given some value, a key is never reported unknown.
TEST(ConfigKeys, EveryListedKeyIsAccepted) {
  const ConfigKeys& keys = KnownConfigKeys();
  auto not_unknown = [](const std::string& yaml, const std::string& key) {
    auto c = ParseConfig(yaml, "k.yaml", "/data/");
    if (!c.ok()) {
      EXPECT_EQ(c.status().message().find("unknown key"), std::string_view::npos) << key << ": " << c.status();
    }
  };
  const std::string stream = "input: {f: {dim: 2, format: dense}}";
  for (const std::string& k : keys.top) not_unknown(k + ": 1\ndatasets: {a: {file: a.ctf, " + stream + "}}\n", k);
  for (const std::string& k : keys.tls) not_unknown("tls: {" + k + ": x}\ndatasets: {a: {file: a.ctf, " + stream + "}}\n", k);
  for (const std::string& k : keys.server)
    not_unknown("server: {" + k + ": 1}\ndatasets: {a: {file: a.ctf, " + stream + "}}\n", k);
  for (const std::string& k : keys.dataset) not_unknown("datasets: {a: {" + k + ": 1, file: a.ctf, " + stream + "}}\n", k);
  for (const std::string& k : keys.deserializer)
    not_unknown("datasets: {a: {deserializers: [{" + k + ": 1, file: a.ctf, " + stream + "}]}}\n", k);
  for (const std::string& k : keys.stream)
    not_unknown("datasets: {a: {file: a.ctf, input: {f: {dim: 2, format: dense, " + k + ": 1}}}}\n", k);
  // And a key outside the lists is unknown, with the closest one suggested.
  auto typo = ParseConfig("datasets: {a: {file: a.ctf, input: {f: {dim: 2, fromat: dense}}}}\n", "k.yaml", "/data/");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown key 'fromat' in input 'f' (did you mean 'format'?)"), std::string_view::npos)
      << typo.status();
}

TEST(ConfigKeys, UnknownKeysSuggestTheClosestOneInEachBlock) {
  const std::string ds = "file: a.ctf, input: {f: {dim: 2, format: dense}}";
  struct Case {
    std::string yaml, expected;
  };
  const Case cases[] = {
      {"datasetz: {a: {" + ds + "}}\n", "unknown top-level key 'datasetz' (did you mean 'datasets'?)"},
      {"server: {maxSubscription: 3}\ndatasets: {a: {" + ds + "}}\n", "(did you mean 'maxSubscriptions'?)"},
      {"datasets: {a: {randomizationSead: 3, " + ds + "}}\n", "(did you mean 'randomizationSeed'?)"},
      {"datasets: {a: {chunksize: 3, " + ds + "}}\n", "(did you mean 'chunkSizeInBytes'?)"},
      {"datasets: {a: {deserializers: [{rspecfier: x, " + ds + "}]}}\n", "(did you mean 'rspecifier'?)"},
      {"datasets: {a: {zzzzzzzz: 1, " + ds + "}}\n", "unknown key 'zzzzzzzz' in dataset 'a'"},
  };
  for (const Case& c : cases) {
    auto r = ParseConfig(c.yaml, "k.yaml", "/data/");
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_NE(r.status().message().find(c.expected), std::string_view::npos) << r.status();
  }
  auto none = ParseConfig("datasets: {a: {zzzzzzzz: 1, " + ds + "}}\n", "k.yaml", "/data/");
  EXPECT_EQ(none.status().message().find("did you mean"), std::string_view::npos) << none.status();
}

TEST(ConfigYaml, AliasesAreBoundedInDepthAndExpansion) {
  auto loop = ParseConfig("a: &a [*a]\n", "loop.yaml", "");
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.status().message().find("loop.yaml:1:4: the configuration nests deeper than 64 levels"),
            std::string_view::npos)
      << loop.status();
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  std::string prev = "a";
  for (int i = 0; i < 9; ++i) {
    const std::string name = "b" + std::to_string(i);
    bomb += name + ": &" + name + " [";
    for (int j = 0; j < 9; ++j) bomb += (j ? ", *" : "*") + prev;
    bomb += "]\n";
    prev = name;
  }
  auto expanded = ParseConfig(bomb, "bomb.yaml", "");  // 9^10 values written in ~500 bytes
  ASSERT_FALSE(expanded.ok());
  EXPECT_NE(expanded.status().message().find("expands to too many values"), std::string_view::npos) << expanded.status();
  // Moderate reuse still works: one block used by two datasets.
  auto reuse = ParseConfig(
      "common: &input {f: {dim: 2, format: dense}}\ndatasets:\n  a: {file: a.ctf, input: *input}\n  b: {file: b.ctf, input: *input}\n",
      "reuse.yaml", "");
  EXPECT_FALSE(reuse.ok());  // 'common' is not a key: aliases need a home inside the schema
  auto reuse2 = ParseConfig(
      "datasets:\n  a: {file: a.ctf, input: &input {f: {dim: 2, format: dense}}}\n  b: {file: b.ctf, input: *input}\n",
      "reuse.yaml", "");
  ASSERT_TRUE(reuse2.ok()) << reuse2.status();
  EXPECT_EQ(reuse2->datasets.size(), 2u);
  EXPECT_EQ(reuse2->datasets[1].deserializers[0].streams[0].dim, 2u);
}

TEST(ConfigServer, UnixSocketModeAndInsecure) {
  const std::string ds = "datasets: {a: {file: a.ctf, input: {f: {dim: 2, format: dense}}}}\n";
  auto c = ParseConfig("insecure: true\nserver: {unixSocketMode: \"0660\"}\n" + ds, "s.yaml", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->insecure);
  EXPECT_EQ(c->server.unix_socket_mode, 0660);
  for (const char* bad : {"0666", "0700", "0606", "9", "rw"}) {
    auto b = ParseConfig(std::string("server: {unixSocketMode: \"") + bad + "\"}\n" + ds, "s.yaml", "");
    EXPECT_FALSE(b.ok()) << bad;
  }
}

}  // namespace
}  // namespace conveyor
