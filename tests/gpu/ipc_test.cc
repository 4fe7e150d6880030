// CUDA IPC as the daemon uses it: a device block exported once, opened by another process
// (a process cannot open its own handle, so the test runs this binary again as the child),
// which reads the parent's bytes at an offset and writes its answer into the block; the
// parent sees it after the child exits. Without a device: the calls say why.
#include "cuda/ipc.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "cuda/slot_pool.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

extern char** environ;

namespace conveyor::gpu {
namespace {

constexpr uint64_t kBlock = 4 << 20;
constexpr uint64_t kOffset = 1 << 20;  // the "slot" the child reads
constexpr uint64_t kBytes = 1 << 16;

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

TEST(CudaIpc, WithoutTheBackendOrADeviceEveryCallSaysWhy) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "a device is present: covered by CudaIpcGpu";
  auto uuid = DeviceUuid(0);
  EXPECT_FALSE(uuid.ok());
  auto found = DeviceByUuid(std::string(kDeviceUuidBytes, '\1'));
  EXPECT_FALSE(found.ok());
  auto opened = OpenIpcHandle(std::string(kIpcHandleBytes, '\0'), 0);
  EXPECT_FALSE(opened.ok());
  EXPECT_FALSE(opened.status().message().empty());
}

TEST(CudaIpcGpu, AnotherProcessOpensTheBlockOnceAndReadsASlot) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  auto block = AllocateMemory(MemoryKind::kDevice, kBlock, 0);
  ASSERT_TRUE(block.ok()) << block.status();
  std::vector<uint8_t> host(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) host[i] = Pattern(i);
  ASSERT_TRUE(CopyMemory(static_cast<std::byte*>(*block) + kOffset, host.data(), kBytes).ok());
  auto handle = ExportIpcHandle(*block, 0);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_EQ(handle->size(), kIpcHandleBytes);
  auto uuid = DeviceUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  auto self = DeviceByUuid(*uuid);
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(*self, 0);
  // The child: this binary, running only the child half, told the handle by environment.
  const std::string env_handle = "CONVEYOR_IPC_HANDLE=" + absl::BytesToHexString(*handle);
  const std::string env_uuid = "CONVEYOR_IPC_UUID=" + absl::BytesToHexString(*uuid);
  std::vector<std::string> env_strings{env_handle, env_uuid};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=CudaIpcGpu.ChildHalf";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child could not open or read the block (its output is above)";
  // The child's answer: the slot's bytes, each plus one, written just after the slot.
  std::vector<uint8_t> answer(kBytes);
  ASSERT_TRUE(CopyMemory(answer.data(), static_cast<std::byte*>(*block) + kOffset + kBytes, kBytes).ok());
  for (uint64_t i = 0; i < kBytes; ++i) ASSERT_EQ(answer[i], static_cast<uint8_t>(Pattern(i) + 1)) << i;
  FreeMemory(MemoryKind::kDevice, *block, 0);
}

// The Python client (client/python/conveyor/cuda_ipc.py, the driver's cuDeviceGetUuid_v2 by
// name) reads every device's UUID as DeviceUuid() does, so that a torch process finds the
// daemon's device. The module is found at $CONVEYOR_PYTHON_CLIENT (the bundle's run.sh sets
// it) or in this build's source tree.
TEST(CudaIpcGpu, ThePythonClientReadsTheSameDeviceUuids) {
  CONVEYOR_REQUIRE_CUDA_DEVICE();
  const char* env = std::getenv("CONVEYOR_PYTHON_CLIENT");
  const std::string module =
      std::string(env != nullptr && *env != 0 ? env : CONVEYOR_PYTHON_CLIENT_DIR) + "/conveyor/cuda_ipc.py";
  if (access(module.c_str(), R_OK) != 0) GTEST_SKIP() << module << " not found (set CONVEYOR_PYTHON_CLIENT)";
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 here";
  const std::string command =
      "python3 -c \"import ctypes, importlib.util, sys\n"
      "s = importlib.util.spec_from_file_location('cuda_ipc', sys.argv[1])\n"
      "m = importlib.util.module_from_spec(s)\n"
      "s.loader.exec_module(m)\n"
      "n = ctypes.c_int(0)\n"
      "assert m._cudart().cudaGetDeviceCount(ctypes.byref(n)) == 0\n"
      "print(' '.join(m.device_uuid(d).hex() for d in range(n.value)))\" '" + module + "'";
  std::FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string python;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), out) != nullptr) python += buf;
  ASSERT_EQ(pclose(out), 0) << "the Python side failed: " << python;
  std::string why, cpp;
  for (int d = 0; d < CudaDeviceCount(&why); ++d) {
    auto uuid = DeviceUuid(d);
    ASSERT_TRUE(uuid.ok()) << uuid.status();
    cpp += (d > 0 ? " " : "") + absl::BytesToHexString(*uuid);
  }
  EXPECT_EQ(python, cpp + "\n");
}

TEST(CudaIpcGpu, ChildHalf) {
  const char* h = std::getenv("CONVEYOR_IPC_HANDLE");
  const char* u = std::getenv("CONVEYOR_IPC_UUID");
  if (h == nullptr || u == nullptr) GTEST_SKIP() << "runs only as the child of AnotherProcessOpensTheBlockOnceAndReadsASlot";
  auto device = DeviceByUuid(absl::HexStringToBytes(u));
  ASSERT_TRUE(device.ok()) << device.status();
  auto p = OpenIpcHandle(absl::HexStringToBytes(h), *device);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<uint8_t> got(kBytes);
  ASSERT_TRUE(CopyMemory(got.data(), static_cast<std::byte*>(*p) + kOffset, kBytes).ok());
  for (uint64_t i = 0; i < kBytes; ++i) ASSERT_EQ(got[i], Pattern(i)) << i;
  for (uint8_t& b : got) ++b;
  ASSERT_TRUE(CopyMemory(static_cast<std::byte*>(*p) + kOffset + kBytes, got.data(), kBytes).ok());
  CloseIpcHandle(*p, *device);
}

}  // namespace
}  // namespace conveyor::gpu
