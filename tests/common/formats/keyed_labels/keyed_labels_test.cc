// The example format of docs/adding-a-format.md: registered by one line, named in a
// configuration, joined by key with a CTF file, without any other change to conveyor.
#include "tests/common/formats/keyed_labels/keyed_labels.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config_loader.h"
#include "common/dataset/dataset.h"
#include "common/formats/registry.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

TEST(KeyedLabels, RegisteredByOneLineAndJoinedWithACtfFileByKey) {
  DeserializerRegistry::Global().Register("KeyedLabels", example::OpenKeyedLabels);  // the one line

  TempDir dir;
  const std::string feats = dir.Write("feats.ctf", "3 |x 1 2\n3 |x 3 4\n1 |x 5 6\n7 |x 7 8\n");
  const std::string labels = dir.Write("labels.txt", "7 2 2 1\n3 0 4\n9 1\n1 4\n");
  auto config = LoadConfigFile(dir.Write("conveyor.yaml", absl::StrCat(
      "datasets:\n  d:\n    randomize: false\n    deserializers:\n"
      "      - type: CNTKTextFormat\n        file: ", feats, "\n        input: {x: {dim: 2, format: dense}}\n"
      "      - type: keyedlabels\n        file: ", labels, "\n        input: {y: {dim: 5, format: ids}}\n")));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->datasets[0].deserializers[1].type, "KeyedLabels");  // the registered spelling
  auto ds = Dataset::Open(config->datasets[0]);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->source_stats().size(), 2u);
  EXPECT_EQ((*ds)->source_stats()[1].entries, 4u);
  auto chunk = (*ds)->SharedChunk(0);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  // Sequences 3, 1, 7 in the CTF file's order; 7 has one frame of features and three labels.
  ASSERT_EQ((*chunk)->names, (std::vector<std::string>{"3", "1", "7"}));
  const ParsedStream& y = (*chunk)->streams[1];
  EXPECT_EQ(y.indices, (HugeVector<int32_t>{0, 4, 4, 2, 2, 1}));
  EXPECT_EQ(y.sequence_begin, (HugeVector<uint64_t>{0, 2, 3, 6}));
}

TEST(KeyedLabels, ABadLineSpendsTheErrorBudget) {
  DeserializerRegistry::Global().Register("KeyedLabels", example::OpenKeyedLabels);
  TempDir dir;
  const std::string labels = dir.Write("labels.txt", "a 1\nb 9\n");
  auto config = LoadConfigFile(dir.Write("conveyor.yaml", absl::StrCat(
      "datasets:\n  d:\n    deserializers:\n"
      "      - type: KeyedLabels\n        file: ", labels, "\n        input: {y: {dim: 5, format: ids}}\n")));
  ASSERT_TRUE(config.ok()) << config.status();
  auto ds = Dataset::Open(config->datasets[0]);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("labels.txt:2: class outside [0, dim)"), std::string::npos) << ds.status();
}

}  // namespace
}  // namespace conveyor::testing
