// The CUDA assembler: staging, and the assembly program (program_runner.h) run on the
// device: the kernels of cuda/kernels/ through their __global__ wrappers, Thrust scans
// between them. The host tests run the same kernels through the host executor.
#include <thrust/execution_policy.h>
#include <thrust/scan.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <deque>
#include <vector>

#include "cuda/assembly_program.h"
#include "cuda/cuda_assembler.h"
#include "cuda/cuda_buffer.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/device_launch.cuh"
#include "cuda/program_runner.h"
#include "cuda/slot_pool.h"

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

// A batch whose destination is host memory: assembled into `device` on the assembler's
// stream, then copied back on the copy stream once `assembled` is reached, so that the next
// batch's assembly runs while this one travels. Page-locked destinations (cudaHostAlloc'd,
// or registered: the transports register their shm segments and inline buffers) are written
// by DMA directly; pageable ones through `pinned`, which Wait() copies on. `copied` marks the
// copy's end. Busy from Begin() until its batch is waited for.
struct Download {
  CudaBuffer device{false}, pinned{true};
  cudaEvent_t assembled = nullptr, copied = nullptr;
  bool busy = false;
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
  cudaStream_t copy_stream = nullptr;  // device -> host copies of batches bound for host memory
  std::vector<std::unique_ptr<Download>> downloads;  // as many as batches begun at once need
  DownloadStats download_stats;
  uint64_t begun = 0;            // fences handed out by Begin()
  struct Pending {
    uint64_t fence;
    cudaEvent_t done;  // recorded after the batch's last operation (device destinations); else nullptr
    Download* download = nullptr;  // host destinations: its copy back
    std::byte* host = nullptr;     // a pageable destination: Wait() copies download->pinned here
    uint64_t bytes = 0;
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
    if (copy_stream != nullptr) cudaStreamSynchronize(copy_stream);
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
    for (auto& d : downloads) {
      d->device.Free();
      d->pinned.Free();
      if (d->assembled != nullptr) cudaEventDestroy(d->assembled);
      if (d->copied != nullptr) cudaEventDestroy(d->copied);
    }
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (restore) cudaSetDevice(previous);
    cudaGetLastError();
  }

  absl::Status Init(const CudaAssemblerOptions& options) {
    device = options.device;
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
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

  // A download no batch in flight uses, made if every one is busy (as many as batches are
  // in flight at once).
  absl::StatusOr<Download*> FreeDownload() {
    for (auto& d : downloads) {
      if (!d->busy) return d.get();
    }
    auto d = std::make_unique<Download>();
    for (cudaEvent_t* e : {&d->assembled, &d->copied}) {
      if (cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming); err != cudaSuccess) {
        if (d->assembled != nullptr) cudaEventDestroy(d->assembled);
        CONVEYOR_CUDA_RETURN_IF_ERROR(err);
      }
    }
    downloads.push_back(std::move(d));
    return downloads.back().get();
  }

  // Begin() into host memory: the batch is assembled in a download's device buffer and
  // copied back on the copy stream; returns once the host's part is done. The caller made
  // `device` current. On an error nothing of this batch is left running.
  absl::StatusOr<uint64_t> BeginHost(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                     absl::Span<std::byte> dst) {
    const uint64_t bytes = plan.total_bytes;
    absl::StatusOr<Download*> made = FreeDownload();
    if (!made.ok()) return made.status();
    Download& d = **made;
    // Free: its last copy completed before its batch was waited for, so it may grow now.
    if (absl::Status st = d.device.Reserve(std::max<uint64_t>(bytes, 1), "device batch buffer"); !st.ok()) return st;
    bool direct = bytes > 0 && IsPageLocked(dst.data(), bytes);
    auto stage = [&] { return d.pinned.Reserve(std::max<uint64_t>(bytes, 1), "pinned download buffer"); };
    if (!direct) {
      if (absl::Status st = stage(); !st.ok()) return st;
    }
    if (absl::Status st = Enqueue(plan, pieces, d.device.data); !st.ok()) return st;
    cudaError_t e = cudaEventRecord(d.assembled, stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(copy_stream, d.assembled, 0);
    if (e == cudaSuccess && direct) {
      e = cudaMemcpyAsync(dst.data(), d.device.data, bytes, cudaMemcpyDeviceToHost, copy_stream);
      if (e == cudaErrorInvalidValue) {
        // Both ends are page-locked but not the range between (two registrations, or a gap
        // unregistered): the pinned buffer serves instead.
        cudaGetLastError();
        direct = false;
        if (absl::Status st = stage(); !st.ok()) {
          cudaStreamSynchronize(stream);
          return st;
        }
        e = cudaSuccess;
      }
    }
    if (e == cudaSuccess && !direct && bytes > 0) {
      e = cudaMemcpyAsync(d.pinned.data, d.device.data, bytes, cudaMemcpyDeviceToHost, copy_stream);
    }
    if (e == cudaSuccess) e = cudaEventRecord(d.copied, copy_stream);
    if (e != cudaSuccess) {
      cudaStreamSynchronize(stream);
      cudaStreamSynchronize(copy_stream);
      CONVEYOR_CUDA_RETURN_IF_ERROR(e);
    }
    d.busy = true;
    ++(direct ? download_stats.direct : download_stats.staged);
    download_stats.buffers = downloads.size();
    Pending p{++begun, nullptr};
    p.download = &d;
    p.host = direct ? nullptr : dst.data();
    p.bytes = bytes;
    pending.push_back(p);
    return begun;
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

DownloadStats CudaAssembler::downloads() const { return impl_->download_stats; }

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
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return m.BeginHost(plan, pieces, dst);
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
  const Impl::Pending p = *it;
  m.pending.erase(it);
  const cudaError_t selected = cudaSetDevice(m.device);
  if (selected != cudaSuccess) {
    if (p.download != nullptr) p.download->busy = false;
    if (p.done != nullptr) m.spare_events.push_back(p.done);
    CONVEYOR_CUDA_RETURN_IF_ERROR(selected);
  }
  if (p.download != nullptr) {
    // The download is free again whatever happens: its copy has ended, or the device failed.
    const cudaError_t e = cudaEventSynchronize(p.download->copied);
    p.download->busy = false;
    CONVEYOR_CUDA_RETURN_IF_ERROR(e);
    if (p.host != nullptr && p.bytes > 0) std::memcpy(p.host, p.download->pinned.data, p.bytes);
    return absl::OkStatus();
  }
  if (p.done == nullptr) return absl::OkStatus();
  m.spare_events.push_back(p.done);
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(p.done));
  return absl::OkStatus();
}

absl::Status CudaAssembler::Synchronize() {
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaAssembler::Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) {
  if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
  // First: what is allocated below (a download's buffers) must be on our device, not the thread's.
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, dst.data()));
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (on_device) {
    if (absl::Status st = impl_->Enqueue(plan, pieces, dst.data()); !st.ok()) return st;
    return Synchronize();
  }
  absl::StatusOr<uint64_t> fence = impl_->BeginHost(plan, pieces, dst);
  if (!fence.ok()) return fence.status();
  return Wait(*fence);
}

}  // namespace conveyor::gpu
