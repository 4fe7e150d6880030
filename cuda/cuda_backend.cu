// Built when CUDA is on: the device probe, memory for slot pools, the CUDA assembler.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_assembler.h"
#include "cuda/cuda_backend.h"
#include "cuda/ipc.h"
#include "cuda/slot_pool.h"

namespace conveyor {

bool CudaBuilt() { return true; }

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();  // clear the error state
    return 0;
  }
  if (n == 0) *why = "no CUDA device present";
  return n;
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int device, uint64_t staging_bytes) {
  gpu::CudaAssemblerOptions options;
  options.device = device;
  if (staging_bytes > 0) options.staging_bytes = staging_bytes;
  auto assembler = gpu::CudaAssembler::Create(options);
  if (!assembler.ok()) return assembler.status();
  return std::unique_ptr<BatchAssembler>(std::move(*assembler));
}

namespace gpu {

absl::StatusOr<void*> AllocateMemory(MemoryKind kind, uint64_t bytes, int device) {
  void* p = nullptr;
  cudaError_t err = cudaSuccess;
  switch (kind) {
    case MemoryKind::kHost:
      p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
      return p;
    case MemoryKind::kPinned:
      err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      break;
    case MemoryKind::kDevice: {
      int previous = 0;
      cudaGetDevice(&previous);
      err = cudaSetDevice(device);
      if (err == cudaSuccess) err = cudaMalloc(&p, bytes);
      cudaSetDevice(previous);
      break;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of ", MemoryKindName(kind),
                                                     " memory", kind == MemoryKind::kDevice ? absl::StrCat(" on device ", device) : "",
                                                     ": ", cudaGetErrorString(err)));
  }
  return p;
}

void FreeMemory(MemoryKind kind, void* ptr, int device) {
  if (ptr == nullptr) return;
  switch (kind) {
    case MemoryKind::kHost: std::free(ptr); return;
    case MemoryKind::kPinned: cudaFreeHost(ptr); return;
    case MemoryKind::kDevice: {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      cudaFree(ptr);
      cudaSetDevice(previous);
      return;
    }
  }
}

namespace {

class CudaHostRegistration final : public HostRegistration {
 public:
  CudaHostRegistration(void* data, int device) : data_(data), device_(device) {}
  ~CudaHostRegistration() override {
    int previous = 0;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device_);
    cudaHostUnregister(data_);
    if (restore) cudaSetDevice(previous);
    cudaGetLastError();
  }

 private:
  void* const data_;
  const int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHostMemory(void* data, uint64_t bytes, int device) {
  if (data == nullptr || bytes == 0) return absl::InvalidArgumentError("cannot page-lock an empty range of memory");
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(err)));
  }
  err = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (restore) cudaSetDevice(previous);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot page-lock ", bytes, " bytes of host memory for device ", device,
                     " (cudaHostRegister: ", cudaGetErrorString(err), ")"));
  }
  return std::unique_ptr<HostRegistration>(new CudaHostRegistration(data, device));
}

bool IsPageLocked(const void* data, uint64_t bytes) {
  if (data == nullptr || bytes == 0) return false;
  const char* p = static_cast<const char*>(data);
  for (const char* q : {p, p + bytes - 1}) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, q) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (attr.type != cudaMemoryTypeHost) return false;
  }
  return true;
}

absl::Status CopyMemory(void* dst, const void* src, uint64_t bytes) {
  static const bool have_device = [] {
    std::string why;
    return CudaDeviceCount(&why) > 0;
  }();
  if (!have_device) {  // no device, so no device memory: both ends are host memory
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  // cudaMemcpy from pageable memory may return once the bytes are staged, before the DMA
  // lands, and a non-blocking stream (the assembler's) is not ordered after the legacy
  // stream it uses: wait for that stream, so that the copy is complete when we return.
  cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaMemcpy of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace conveyor

// CUDA IPC (ipc.h).
namespace conveyor::gpu {
namespace {

// Runs `f` with `device` current, restoring the caller's device.
template <typename F>
cudaError_t OnDevice(int device, F f) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = f();
  cudaSetDevice(previous);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

}  // namespace

absl::StatusOr<std::string> ExportIpcHandle(const void* base, int device) {
  cudaIpcMemHandle_t h;
  const cudaError_t err = OnDevice(device, [&] { return cudaIpcGetMemHandle(&h, const_cast<void*>(base)); });
  if (err != cudaSuccess) return absl::InternalError(absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(err)));
  static_assert(sizeof(h) == kIpcHandleBytes, "cudaIpcMemHandle_t is 64 bytes");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(err)));
  }
  static_assert(sizeof(prop.uuid) == kDeviceUuidBytes, "a device UUID is 16 bytes");
  return std::string(reinterpret_cast<const char*>(&prop.uuid), sizeof(prop.uuid));
}

absl::StatusOr<int> DeviceByUuid(const std::string& uuid) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  for (int d = 0; d < n; ++d) {
    auto u = DeviceUuid(d);
    if (u.ok() && *u == uuid) return d;
  }
  return absl::NotFoundError(absl::StrCat("the daemon's CUDA device is not visible to this process (", n,
                                          " device(s) visible", n == 0 ? ": " + why : "",
                                          "; check CUDA_VISIBLE_DEVICES), so its batches cannot be opened here"));
}

absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle is ", kIpcHandleBytes, " bytes, not ", handle.size()));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  const cudaError_t err =
      OnDevice(device, [&] { return cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); });
  if (err != cudaSuccess) return absl::InternalError(absl::StrCat("cudaIpcOpenMemHandle: ", cudaGetErrorString(err)));
  return p;
}

void CloseIpcHandle(void* ptr, int device) {
  if (ptr == nullptr) return;
  OnDevice(device, [&] { return cudaIpcCloseMemHandle(ptr); });
}

}  // namespace conveyor::gpu
