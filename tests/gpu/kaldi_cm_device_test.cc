// Kaldi compressed matrices decoded on the device give bit for bit the floats of the CPU
// decoder (itself checked against Kaldi in kaldi_golden_test): every CM/CM2/CM3 matrix in
// tests/data/kaldi, and random matrices of each kind covering every byte value. (The same
// kernel on the host executor: host_kernels_test.cc.)
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/formats/kaldi/kaldi_object.h"
#include "common/formats/kaldi/kaldi_table.h"
#include "cuda/cases/compressed_cases.h"
#include "cuda/kaldi_cm_device.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::gpu {
namespace {

bool Compressed(kaldi::ObjectType t) {
  return t == kaldi::ObjectType::kCompressed1 || t == kaldi::ObjectType::kCompressed2 ||
         t == kaldi::ObjectType::kCompressed3;
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
      objects.push_back(conveyor::testing::RandomCompressed(format, rows, cols, rng));
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
