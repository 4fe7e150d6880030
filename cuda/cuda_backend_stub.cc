// Built when CUDA is off: no device, no CUDA assembler; slot pools of plain host memory only.
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_assembler.h"
#include "cuda/cuda_backend.h"
#include "cuda/ipc.h"
#include "cuda/kaldi_cm_device.h"
#include "cuda/slot_pool.h"

namespace conveyor {

namespace {
constexpr char kNotBuilt[] = "this build has no CUDA backend (configure with CONVEYOR_CUDA=ON where nvcc exists)";
}

bool CudaBuilt() { return false; }

int CudaDeviceCount(std::string* why) {
  *why = kNotBuilt;
  return 0;
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> MakeCudaAssembler(int, uint64_t) {
  return absl::UnimplementedError(kNotBuilt);
}

namespace gpu {

struct CudaAssembler::Impl {};
CudaAssembler::CudaAssembler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaAssembler::~CudaAssembler() = default;
absl::StatusOr<std::unique_ptr<CudaAssembler>> CudaAssembler::Create(const CudaAssemblerOptions&) {
  return absl::UnimplementedError(kNotBuilt);
}
absl::Status CudaAssembler::Assemble(const BatchPlan&, absl::Span<const PieceRef>, absl::Span<std::byte>) {
  return absl::UnimplementedError(kNotBuilt);
}
absl::Status CudaAssembler::AssembleAsync(const BatchPlan&, absl::Span<const PieceRef>, std::byte*) {
  return absl::UnimplementedError(kNotBuilt);
}
absl::Status CudaAssembler::Synchronize() { return absl::UnimplementedError(kNotBuilt); }
absl::StatusOr<uint64_t> CudaAssembler::Begin(const BatchPlan&, absl::Span<const PieceRef>, absl::Span<std::byte>) {
  return absl::UnimplementedError(kNotBuilt);
}
absl::Status CudaAssembler::Wait(uint64_t) { return absl::UnimplementedError(kNotBuilt); }
int CudaAssembler::device() const { return -1; }
ProgramStats CudaAssembler::stats() const { return {}; }
uint64_t CudaAssembler::scan_buffer_fallbacks() const { return 0; }
DownloadStats CudaAssembler::downloads() const { return {}; }
absl::Status CudaAssembler::StallForTesting(absl::Duration) { return absl::UnimplementedError(kNotBuilt); }

absl::StatusOr<void*> AllocateMemory(MemoryKind kind, uint64_t bytes, int) {
  if (kind != MemoryKind::kHost) {
    return absl::UnimplementedError(absl::StrCat(MemoryKindName(kind), " memory needs the CUDA backend; ", kNotBuilt));
  }
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  return p;
}

void FreeMemory(MemoryKind, void* ptr, int) { std::free(ptr); }

bool IsPageLocked(const void*, uint64_t) { return false; }

absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHostMemory(void*, uint64_t, int) {
  return absl::UnimplementedError(absl::StrCat("page-locking host memory needs the CUDA backend; ", kNotBuilt));
}

absl::Status CopyMemory(void* dst, const void* src, uint64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

struct DeviceCmDecoder::Impl {};
DeviceCmDecoder::DeviceCmDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceCmDecoder::~DeviceCmDecoder() = default;
absl::StatusOr<std::unique_ptr<DeviceCmDecoder>> DeviceCmDecoder::Create(int) { return absl::UnimplementedError(kNotBuilt); }
absl::Status DeviceCmDecoder::Decode(absl::Span<const CompressedJob>, float*) { return absl::UnimplementedError(kNotBuilt); }
absl::Status DeviceCmDecoder::DecodeToHost(absl::Span<const CompressedJob>, float*, uint64_t) {
  return absl::UnimplementedError(kNotBuilt);
}

}  // namespace gpu
}  // namespace conveyor

namespace conveyor::gpu {
absl::StatusOr<std::string> ExportIpcHandle(const void*, int) { return absl::UnimplementedError(kNotBuilt); }
absl::StatusOr<std::string> DeviceUuid(int) { return absl::UnimplementedError(kNotBuilt); }
absl::StatusOr<int> DeviceByUuid(const std::string&) { return absl::UnimplementedError(kNotBuilt); }
absl::StatusOr<void*> OpenIpcHandle(const std::string&, int) { return absl::UnimplementedError(kNotBuilt); }
void CloseIpcHandle(void*, int) {}
}  // namespace conveyor::gpu
