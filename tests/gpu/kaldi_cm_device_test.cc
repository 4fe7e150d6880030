// Kaldi compressed matrices decoded on the device give bit for bit the floats of the CPU
// decoder (itself checked against Kaldi in kaldi_golden_test): every CM/CM2/CM3 matrix in
// tests/data/kaldi, and random matrices of each kind covering every byte value.
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_object.h"
#include "common/formats/kaldi/kaldi_table.h"
#include "cuda/kaldi_cm_device.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

bool Compressed(kaldi::ObjectType t) {
  return t == kaldi::ObjectType::kCompressed1 || t == kaldi::ObjectType::kCompressed2 ||
         t == kaldi::ObjectType::kCompressed3;
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A random compressed matrix object: `format` 1 (CM), 2 (CM2) or 3 (CM3).
std::string RandomCompressed(int format, int32_t rows, int32_t cols, std::mt19937& rng) {
  std::string s("\0B", 2);
  s += format == 1 ? "CM " : format == 2 ? "CM2 " : "CM3 ";
  std::uniform_real_distribution<float> u(-50, 50);
  const float min_value = u(rng), range = std::abs(u(rng)) + 0.001f;
  Put(&s, min_value);
  Put(&s, range);
  Put(&s, rows);
  Put(&s, cols);
  if (format == 1) {
    for (int32_t c = 0; c < cols; ++c) {
      uint16_t p[4];
      for (uint16_t& v : p) v = static_cast<uint16_t>(rng());
      std::sort(p, p + 4);
      for (uint16_t v : p) Put(&s, v);
    }
  }
  const int width = format == 2 ? 2 : 1;
  for (int64_t i = 0; i < int64_t{rows} * cols * width; ++i) s.push_back(static_cast<char>(rng()));
  return s;
}

void ExpectDeviceMatchesCpu(const std::vector<CompressedJob>& jobs, uint64_t floats) {
  auto decoder = DeviceCmDecoder::Create(0);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  std::vector<float> want(floats, 0.0f), got(floats, -1.0f);
  for (const CompressedJob& j : jobs) {
    kaldi::Window w{0, j.info.rows, 0, j.info.cols};
    kaldi::DecodeMatrix<float>(j.bytes, j.offset, j.info, w, want.data() + j.out_offset);
  }
  ASSERT_TRUE((*decoder)->DecodeToHost(jobs, got.data(), floats).ok());
  size_t differ = 0;
  for (uint64_t i = 0; i < floats; ++i) differ += std::memcmp(&want[i], &got[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "of " << floats << " values";
}

TEST(DeviceCmDecoderGpu, EveryTestdataMatrixMatchesTheCpuDecoderBitForBit) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  const std::string dir = conveyor::testing::TestdataDir() + "/kaldi";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not found (set CONVEYOR_TESTDATA)";
  std::vector<std::unique_ptr<kaldi::KaldiTable>> tables;
  std::vector<CompressedJob> jobs;
  uint64_t floats = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("cm", 0) != 0 || f.path().extension() != ".ark") continue;
    kaldi::TableOptions options;
    options.tolerate = [](const std::string&) { return true; };
    auto table = kaldi::KaldiTable::Open("ark:" + f.path().string(), options);
    ASSERT_TRUE(table.ok()) << table.status();
    for (const kaldi::TableEntry& e : (*table)->entries()) {
      if (!Compressed(e.info.type)) continue;
      jobs.push_back({(*table)->bytes(e.source), e.offset, e.info, floats});
      floats += static_cast<uint64_t>(e.info.rows * e.info.cols);
    }
    tables.push_back(std::move(*table));
  }
  ASSERT_GT(jobs.size(), 10u);
  ExpectDeviceMatchesCpu(jobs, floats);
}

TEST(DeviceCmDecoderGpu, RandomMatricesOfEachKindMatchTheCpuDecoderBitForBit) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(7);
  std::vector<std::string> objects;
  for (int format : {1, 2, 3}) {
    for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {1000, 40}, {3, 700}, {257, 13}, {5000, 1}}) {
      objects.push_back(RandomCompressed(format, rows, cols, rng));
    }
  }
  std::vector<CompressedJob> jobs;
  uint64_t floats = 0;
  for (const std::string& o : objects) {
    auto info = kaldi::ScanObject(o, 0, kaldi::ObjectKind::kMatrix);
    ASSERT_TRUE(info.ok()) << info.status();
    jobs.push_back({o, 0, *info, floats});
    floats += static_cast<uint64_t>(info->rows * info->cols);
  }
  ExpectDeviceMatchesCpu(jobs, floats);
}

TEST(DeviceCmDecoder, RefusesWhatIsNotACompressedMatrixOrNoDevice) {
  auto decoder = DeviceCmDecoder::Create(0);
  if (!decoder.ok()) {
    EXPECT_TRUE(decoder.status().code() == absl::StatusCode::kFailedPrecondition ||
                decoder.status().code() == absl::StatusCode::kUnimplemented)
        << decoder.status();
    return;
  }
  std::string fm("\0BFM ", 5);
  fm += std::string("\4\1\0\0\0\4\1\0\0\0", 10) + std::string(4, '\0');
  auto info = kaldi::ScanObject(fm, 0, kaldi::ObjectKind::kMatrix);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<CompressedJob> jobs = {{fm, 0, *info, 0}};
  float out = 0;
  EXPECT_EQ((*decoder)->DecodeToHost(jobs, &out, 1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::gpu
