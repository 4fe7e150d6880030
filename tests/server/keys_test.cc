// Keys are bytes end to end: a Kaldi utterance id that is not UTF-8 (m\xfcller, Latin-1)
// travels in Pieces.name (bytes), reaches the C++ client unchanged, and `conveyor dump` and
// `conveyor subscribe --dump` print it as valid UTF-8 JSON (\udcfc), the same lines.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/server/test_daemon.h"

namespace conveyor::testing {
namespace {

class NonUtf8Keys : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write(
        "feats.ark",
        std::string("m\xfcller  [\n  1 2\n  3 4 ]\nplain  [\n  5 6 ]\n\xff\xfe  [\n  7 8 ]\n"));
    config_ = dir_.Write("kaldi.yaml", R"(datasets:
  speech:
    randomize: false
    deserializers:
      - type: KaldiTable
        rspecifier: "ark:feats.ark"
        input: {features: {dim: 2}}
)");
  }
  std::string Run(const std::string& args) { return RunCommand(std::string(CONVEYOR_BINARY) + " " + args).out; }
  TempDir dir_;
  std::string config_;
};

bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

TEST_F(NonUtf8Keys, TravelAsBytesAndDumpAsValidJson) {
  Daemon d({}, config_);
  auto client = Client::Connect(d.tcp());
  v1::Subscribe s;
  s.set_dataset("speech");
  s.set_minibatch_size(100);
  auto sub = (*client)->Subscribe(s);
  ReceivedBatch b;
  auto more = (*sub)->Next(&b);
  ASSERT_TRUE(more.ok()) << more.status();
  ASSERT_TRUE(*more);
  ASSERT_EQ(b.descriptor().pieces().name_size(), 3);
  EXPECT_EQ(b.descriptor().pieces().name(0), "m\xfcller");
  EXPECT_EQ(b.descriptor().pieces().name(1), "plain");
  EXPECT_EQ(b.descriptor().pieces().name(2), "\xff\xfe");
  EXPECT_FALSE(*(*sub)->Next(&b));

  const std::string dumped = Run("dump " + config_ + " --dataset speech --minibatch-size 100");
  EXPECT_TRUE(ValidUtf8(dumped)) << dumped;
  EXPECT_NE(dumped.find(R"("key":"m\udcfcller")"), std::string::npos) << dumped;
  EXPECT_NE(dumped.find(R"("key":"\udcff\udcfe")"), std::string::npos) << dumped;
  const std::string subscribed =
      Run("subscribe " + d.tcp() + " --dataset speech --minibatch-size 100 --dump");
  EXPECT_EQ(subscribed, dumped);
}

}  // namespace
}  // namespace conveyor::testing
