// The CUDA assembler: staging, and the assembly program (program_runner.h) run on the
// device: the kernels of cuda/kernels/ through their __global__ wrappers, Thrust scans
// between them. The host tests run the same kernels through the host executor.
#include <thrust/execution_policy.h>
#include <thrust/scan.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <vector>

#include "cuda/assembly_program.h"
#include "cuda/cuda_assembler.h"
#include "cuda/cuda_buffer.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/device_launch.cuh"
#include "cuda/program_runner.h"

namespace conveyor::gpu {
namespace {

// Thrust's temporary storage from a buffer the assembler keeps (no allocation per batch;
// uses are ordered on the assembler's stream). A request larger than the buffer is served
// stream-ordered (cudaMallocAsync/cudaFreeAsync) this once, and the buffer grows to the
// largest request before the next scan.
struct TempAllocator {
  using value_type = char;
  char* buffer = nullptr;
  uint64_t capacity = 0;
  uint64_t* wanted = nullptr;
  uint64_t* fallbacks = nullptr;
  cudaStream_t stream = nullptr;
  char* allocate(std::ptrdiff_t bytes) {
    if (static_cast<uint64_t>(bytes) > *wanted) *wanted = static_cast<uint64_t>(bytes);
    if (static_cast<uint64_t>(bytes) <= capacity) return buffer;
    char* p = nullptr;
    if (cudaMallocAsync(reinterpret_cast<void**>(&p), static_cast<size_t>(bytes), stream) != cudaSuccess) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    ++*fallbacks;
    return p;
  }
  void deallocate(char* p, size_t) {
    if (p != buffer) cudaFreeAsync(p, stream);
  }
};

// Spins for `duration_ns` of the device's global timer (StallForTesting).
__global__ void SpinKernel(uint64_t duration_ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < duration_ns);
}

// One of the two staging sets: pinned buffer, its device mirror (+ scratch), and the event
// after which the pinned buffer may be rewritten.
struct StagingSet {
  CudaBuffer host{true}, device{false};
  cudaEvent_t sent = nullptr;
};

}  // namespace

struct CudaAssembler::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  StagingSet sets[2];
  int next = 0;
  CudaBuffer temp{false};        // Thrust temporaries
  uint64_t temp_wanted = 0;
  uint64_t temp_fallbacks = 0;
  CudaBuffer bounce{false};      // device slot for batches whose destination is host memory
  uint64_t begun = 0;            // fences handed out by Begin()
  struct Pending {
    uint64_t fence;
    cudaEvent_t done;  // recorded after the batch's last operation; nullptr: complete at Begin
  };
  std::deque<Pending> pending;   // begun, not waited for (oldest first)
  std::vector<cudaEvent_t> spare_events;
  ProgramStats stats;

  // program_runner.h's device side: kernels on the assembler's stream, Thrust scans.
  struct Backend {
    Impl& m;
    LaunchPolicy policy() const { return kDeviceLaunchPolicy; }
    template <typename K>
    absl::Status Launch(const K& kernel, LaunchShape shape, const char* name) {
      return LaunchOnDevice(kernel, shape, m.stream, name);
    }
    template <typename P>
    absl::Status ExclusiveScan(const P* in, uint64_t n, P* out) {
      if (m.temp.capacity < m.temp_wanted) {
        CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));  // the buffer may be in use
        if (absl::Status st = m.temp.Reserve(m.temp_wanted, "scan buffer"); !st.ok()) return st;
      }
      TempAllocator alloc{reinterpret_cast<char*>(m.temp.data), m.temp.capacity, &m.temp_wanted, &m.temp_fallbacks,
                          m.stream};
      try {
        thrust::exclusive_scan(thrust::cuda::par_nosync(alloc).on(m.stream), in, in + n, out);
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat("exclusive scan (thrust::exclusive_scan) failed: ", e.what()));
      }
      return absl::OkStatus();
    }
    absl::Status Zero(std::byte* p, uint64_t bytes) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, bytes, m.stream));
      return absl::OkStatus();
    }
  };

  ~Impl() {
    // Everything here belongs to `device`, whichever thread destroys the assembler.
    int previous = 0;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (const Pending& p : pending) {
      if (p.done != nullptr) cudaEventDestroy(p.done);
    }
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
    for (StagingSet& s : sets) {
      s.host.Free();
      s.device.Free();
      if (s.sent != nullptr) cudaEventDestroy(s.sent);
    }
    temp.Free();
    bounce.Free();
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (restore) cudaSetDevice(previous);
    cudaGetLastError();
  }

  absl::Status Init(const CudaAssemblerOptions& options) {
    device = options.device;
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (StagingSet& s : sets) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.sent, cudaEventDisableTiming));
      if (absl::Status st = s.host.Reserve(options.staging_bytes, "pinned staging buffer"); !st.ok()) return st;
      if (absl::Status st = s.device.Reserve(options.staging_bytes, "device staging buffer"); !st.ok()) return st;
    }
    return temp.Reserve(options.scan_buffer_bytes, "scan buffer");
  }

  // Everything the device does for a batch, enqueued on the stream. The caller made `device`
  // current. On an error after work was enqueued, waits for the stream before returning, so
  // that nothing still writes `slot` (or reads staging) once the caller has the error.
  absl::Status Enqueue(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* slot) {
    absl::StatusOr<AssemblyProgram> prog = BuildAssemblyProgram(plan, pieces);
    if (!prog.ok()) return prog.status();
    absl::Status st = EnqueueProgram(*prog, slot);
    if (!st.ok()) {
      cudaStreamSynchronize(stream);
      cudaGetLastError();
    }
    return st;
  }

  absl::Status EnqueueProgram(const AssemblyProgram& prog, std::byte* slot) {
    StagingSet& set = sets[next];
    next ^= 1;
    // The pinned buffer was last sent two batches ago; wait until that copy is done.
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(set.sent));
    const uint64_t device_bytes = (prog.staging_bytes + 255) / 256 * 256 + prog.scratch_bytes;
    if (prog.staging_bytes > set.host.capacity || device_bytes > set.device.capacity) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the device mirror may be in use
      if (absl::Status st = set.host.Reserve(prog.staging_bytes, "pinned staging buffer"); !st.ok()) return st;
      if (absl::Status st = set.device.Reserve(device_bytes, "device staging buffer"); !st.ok()) return st;
    }
    PackStaging(prog, set.host.data);
    std::byte* staging = set.device.data;
    std::byte* scratch = staging + (prog.staging_bytes + 255) / 256 * 256;
    CONVEYOR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging, set.host.data, prog.staging_bytes, cudaMemcpyHostToDevice, stream));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventRecord(set.sent, stream));
    Backend backend{*this};
    return RunProgram(prog, staging, scratch, slot, backend, &stats);
  }
};

CudaAssembler::CudaAssembler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaAssembler::~CudaAssembler() = default;

absl::StatusOr<std::unique_ptr<CudaAssembler>> CudaAssembler::Create(const CudaAssemblerOptions& options) {
  if (absl::Status st = CheckCudaDevice(options.device); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  if (absl::Status st = impl->Init(options); !st.ok()) return st;
  return std::unique_ptr<CudaAssembler>(new CudaAssembler(std::move(impl)));
}

int CudaAssembler::device() const { return impl_->device; }

ProgramStats CudaAssembler::stats() const { return impl_->stats; }

uint64_t CudaAssembler::scan_buffer_fallbacks() const { return impl_->temp_fallbacks; }

absl::Status CudaAssembler::StallForTesting(absl::Duration duration) {
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  SpinKernel<<<1, 1, 0, impl_->stream>>>(static_cast<uint64_t>(absl::ToInt64Nanoseconds(duration)));
  CONVEYOR_CUDA_CHECK_LAUNCH("SpinKernel");
  return absl::OkStatus();
}

absl::Status CudaAssembler::AssembleAsync(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* device_dst) {
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  return impl_->Enqueue(plan, pieces, device_dst);
}

absl::StatusOr<uint64_t> CudaAssembler::Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                               absl::Span<std::byte> dst) {
  Impl& m = *impl_;
  if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, dst.data()));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    // Host memory goes through the one bounce buffer: assembled and copied back at once.
    if (absl::Status st = Assemble(plan, pieces, dst); !st.ok()) return st;
    m.pending.push_back({++m.begun, nullptr});
    return m.begun;
  }
  // Enqueue() copies all it reads from the pieces into pinned staging before it returns,
  // so only the device's work remains: an event marks its end. (On an error it has waited
  // for the stream: no fence is needed for a batch that failed.)
  if (absl::Status st = m.Enqueue(plan, pieces, dst.data()); !st.ok()) return st;
  cudaEvent_t done = nullptr;
  if (!m.spare_events.empty()) {
    done = m.spare_events.back();
    m.spare_events.pop_back();
  } else if (cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming); e != cudaSuccess) {
    cudaStreamSynchronize(m.stream);  // no fence to hand out: the batch must be complete before we fail
    CONVEYOR_CUDA_RETURN_IF_ERROR(e);
  }
  if (cudaError_t e = cudaEventRecord(done, m.stream); e != cudaSuccess) {
    m.spare_events.push_back(done);
    cudaStreamSynchronize(m.stream);
    CONVEYOR_CUDA_RETURN_IF_ERROR(e);
  }
  m.pending.push_back({++m.begun, done});
  return m.begun;
}

absl::Status CudaAssembler::Wait(uint64_t fence) {
  Impl& m = *impl_;
  auto it = std::find_if(m.pending.begin(), m.pending.end(), [&](const Impl::Pending& p) { return p.fence == fence; });
  if (it == m.pending.end()) return absl::InvalidArgumentError(absl::StrCat("no batch begun is waiting as fence ", fence));
  cudaEvent_t done = it->done;
  m.pending.erase(it);
  if (done == nullptr) return absl::OkStatus();
  m.spare_events.push_back(done);
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done));
  return absl::OkStatus();
}

absl::Status CudaAssembler::Synchronize() {
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaAssembler::Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) {
  if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
  // First: the bounce buffer below must be allocated on our device, not the thread's.
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, dst.data()));
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (on_device) {
    if (absl::Status st = impl_->Enqueue(plan, pieces, dst.data()); !st.ok()) return st;
    return Synchronize();
  }
  if (plan.total_bytes > impl_->bounce.capacity) {
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
    if (absl::Status st = impl_->bounce.Reserve(plan.total_bytes, "device batch buffer"); !st.ok()) return st;
  }
  if (absl::Status st = impl_->Enqueue(plan, pieces, impl_->bounce.data); !st.ok()) return st;
  if (cudaError_t e = cudaMemcpyAsync(dst.data(), impl_->bounce.data, plan.total_bytes, cudaMemcpyDeviceToHost,
                                      impl_->stream);
      e != cudaSuccess) {
    cudaStreamSynchronize(impl_->stream);
    CONVEYOR_CUDA_RETURN_IF_ERROR(e);
  }
  return Synchronize();
}

}  // namespace conveyor::gpu
