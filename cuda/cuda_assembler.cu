// The CUDA assembler: staging, the assembly kernels, Thrust scans and cuSPARSE transposes.
// The kernels do exactly what RunProgramOnHost() does (assembly_program.cc).
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
#include "cuda/kaldi_cm_kernels.h"

namespace conveyor::gpu {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 65535;

unsigned Blocks(uint64_t items) { return static_cast<unsigned>(std::min<uint64_t>(std::max<uint64_t>(items, 1), kMaxBlocks)); }

// One block per copy item; 16-byte moves when both ends and the length allow.
__global__ void CopyItemsKernel(const CopyItem* items, uint64_t n, const std::byte* staging, std::byte* slot) {
  for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const CopyItem it = items[i];
    const std::byte* src = staging + it.src;
    std::byte* dst = slot + it.dst;
    const uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | it.bytes;
    if ((bits & 15) == 0) {
      const auto* s = reinterpret_cast<const uint4*>(src);
      auto* d = reinterpret_cast<uint4*>(dst);
      for (uint64_t k = threadIdx.x; k < it.bytes / 16; k += blockDim.x) d[k] = s[k];
    } else if ((bits & 3) == 0) {
      const auto* s = reinterpret_cast<const uint32_t*>(src);
      auto* d = reinterpret_cast<uint32_t*>(dst);
      for (uint64_t k = threadIdx.x; k < it.bytes / 4; k += blockDim.x) d[k] = s[k];
    } else {
      for (uint64_t k = threadIdx.x; k < it.bytes; k += blockDim.x) dst[k] = src[k];
    }
  }
}

// One block per CSC piece: its row indices and values go to colptr[first_col] (already
// scanned) of the stream's arrays.
template <typename T>
__global__ void CscPiecesKernel(const CscPieceOp* ops, uint64_t n, const std::byte* staging, std::byte* slot,
                                std::byte* scratch) {
  for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const CscPieceOp op = ops[i];
    std::byte* base = op.in_scratch ? scratch : slot;
    const uint64_t at = op.wide ? static_cast<uint64_t>(reinterpret_cast<const int64_t*>(base + op.colptr)[op.first_col])
                                : static_cast<uint64_t>(reinterpret_cast<const int32_t*>(base + op.colptr)[op.first_col]);
    const auto* src_rowind = reinterpret_cast<const int32_t*>(staging + op.src_rowind);
    const auto* src_values = reinterpret_cast<const T*>(staging + op.src_values);
    auto* rowind = reinterpret_cast<int32_t*>(base + op.rowind) + at;
    T* values = reinterpret_cast<T*>(base + op.values) + at;
    for (uint64_t k = threadIdx.x; k < op.nnz; k += blockDim.x) {
      rowind[k] = src_rowind[k];
      values[k] = src_values[k];
    }
  }
}

// One thread per sparse sample delivered dense: its entries added in file order into its
// zeroed dense column (no two ops share a column, so no atomics, and the sums are the CPU's).
template <typename T>
__global__ void ScatterKernel(const ScatterOp* ops, uint64_t n, const std::byte* staging, std::byte* slot) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    const ScatterOp op = ops[i];
    const auto* rowind = reinterpret_cast<const int32_t*>(staging + op.src_rowind);
    const auto* values = reinterpret_cast<const T*>(staging + op.src_values);
    T* column = reinterpret_cast<T*>(slot + op.dst);
    for (uint64_t k = 0; k < op.nnz; ++k) column[rowind[k]] += values[k];
  }
}

// Thrust's temporary storage from a buffer the assembler keeps (no allocation per batch;
// uses are ordered on the assembler's stream).
struct TempAllocator {
  using value_type = char;
  char* buffer = nullptr;
  uint64_t capacity = 0;
  uint64_t* wanted = nullptr;  // the largest request, to grow the buffer before the next batch
  char* allocate(std::ptrdiff_t bytes) {
    if (static_cast<uint64_t>(bytes) > *wanted) *wanted = static_cast<uint64_t>(bytes);
    if (static_cast<uint64_t>(bytes) <= capacity) return buffer;
    char* p = nullptr;  // too small this once: a temporary allocation, freed below
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void deallocate(char* p, size_t) {
    if (p != buffer) cudaFree(p);
  }
};

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
  cusparseHandle_t sparse = nullptr;
  StagingSet sets[2];
  int next = 0;
  CudaBuffer temp{false};        // Thrust temporaries
  uint64_t temp_wanted = 0;
  CudaBuffer transpose{false};   // cuSPARSE csr2csc buffer
  CudaBuffer bounce{false};      // device slot for batches whose destination is host memory
  uint64_t begun = 0;            // fences handed out by Begin()
  struct Pending {
    uint64_t fence;
    cudaEvent_t done;  // recorded after the batch's last operation; nullptr: complete at Begin
  };
  std::deque<Pending> pending;   // begun, not waited for (oldest first)
  std::vector<cudaEvent_t> spare_events;

  ~Impl() {
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
    transpose.Free();
    bounce.Free();
    if (sparse != nullptr) cusparseDestroy(sparse);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Init(const CudaAssemblerOptions& options) {
    device = options.device;
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CONVEYOR_CUSPARSE_RETURN_IF_ERROR(cusparseCreate(&sparse));
    CONVEYOR_CUSPARSE_RETURN_IF_ERROR(cusparseSetStream(sparse, stream));
    for (StagingSet& s : sets) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.sent, cudaEventDisableTiming));
      if (absl::Status st = s.host.Reserve(options.staging_bytes, "pinned staging buffer"); !st.ok()) return st;
      if (absl::Status st = s.device.Reserve(options.staging_bytes, "device staging buffer"); !st.ok()) return st;
    }
    return temp.Reserve(1 << 20, "scan buffer");
  }

  template <typename T>
  absl::Status Launch(const AssemblyProgram& prog, const std::byte* staging, std::byte* scratch, std::byte* slot) {
    if (!prog.copies.empty()) {
      CopyItemsKernel<<<Blocks(prog.copies.size()), kThreads, 0, stream>>>(
          reinterpret_cast<const CopyItem*>(staging + prog.copies_at), prog.copies.size(), staging, slot);
      CONVEYOR_CUDA_CHECK_LAUNCH("CopyItemsKernel");
    }
    if (prog.scans.size() > 0 && temp.capacity < temp_wanted) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      if (absl::Status st = temp.Reserve(temp_wanted, "scan buffer"); !st.ok()) return st;
    }
    TempAllocator alloc{reinterpret_cast<char*>(temp.data), temp.capacity, &temp_wanted};
    for (const ScanOp& scan : prog.scans) {
      std::byte* base = scan.in_scratch ? scratch : slot;
      try {
        if (scan.wide) {
          const auto* in = reinterpret_cast<const int64_t*>(staging + scan.counts);
          thrust::exclusive_scan(thrust::cuda::par_nosync(alloc).on(stream), in, in + scan.cols + 1,
                                 reinterpret_cast<int64_t*>(base + scan.colptr));
        } else {
          const auto* in = reinterpret_cast<const int32_t*>(staging + scan.counts);
          thrust::exclusive_scan(thrust::cuda::par_nosync(alloc).on(stream), in, in + scan.cols + 1,
                                 reinterpret_cast<int32_t*>(base + scan.colptr));
        }
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat("colptr scan (thrust::exclusive_scan) failed: ", e.what()));
      }
    }
    if (!prog.csc_pieces.empty()) {
      CscPiecesKernel<T><<<Blocks(prog.csc_pieces.size()), kThreads, 0, stream>>>(
          reinterpret_cast<const CscPieceOp*>(staging + prog.csc_pieces_at), prog.csc_pieces.size(), staging, slot,
          scratch);
      CONVEYOR_CUDA_CHECK_LAUNCH("CscPiecesKernel");
    }
    if (!prog.scatters.empty()) {
      ScatterKernel<T><<<Blocks((prog.scatters.size() + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          reinterpret_cast<const ScatterOp*>(staging + prog.scatters_at), prog.scatters.size(), staging, slot);
      CONVEYOR_CUDA_CHECK_LAUNCH("ScatterKernel");
    }
    if (!prog.decodes.empty()) {  // Kaldi compressed matrices left compressed in the chunks
      CONVEYOR_CUDA_RETURN_IF_ERROR(LaunchDecodeOps(reinterpret_cast<const DecodeOp*>(staging + prog.decodes_at),
                                                    prog.decodes.size(), staging, slot, sizeof(T) == 8, stream));
    }
    const cudaDataType value_type = sizeof(T) == 4 ? CUDA_R_32F : CUDA_R_64F;
    for (const TransposeOp& tr : prog.transposes) {
      if (tr.nnz == 0) continue;  // rowptr stays zero, as zeroed
      const int m = static_cast<int>(tr.cols), n = static_cast<int>(tr.dim), nnz = static_cast<int>(tr.nnz);
      const void* csr_values = scratch + tr.csc_values;
      const auto* csr_rowptr = reinterpret_cast<const int*>(scratch + tr.csc_colptr);
      const auto* csr_colind = reinterpret_cast<const int*>(scratch + tr.csc_rowind);
      void* csc_values = slot + tr.values;
      auto* csc_colptr = reinterpret_cast<int*>(slot + tr.rowptr);
      auto* csc_rowind = reinterpret_cast<int*>(slot + tr.colind);
      size_t need = 0;
      CONVEYOR_CUSPARSE_RETURN_IF_ERROR(cusparseCsr2cscEx2_bufferSize(
          sparse, m, n, nnz, csr_values, csr_rowptr, csr_colind, csc_values, csc_colptr, csc_rowind, value_type,
          CUSPARSE_ACTION_NUMERIC, CUSPARSE_INDEX_BASE_ZERO, CUSPARSE_CSR2CSC_ALG1, &need));
      if (need > transpose.capacity) {
        CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        if (absl::Status st = transpose.Reserve(std::max<uint64_t>(need, 1 << 20), "cuSPARSE buffer"); !st.ok()) return st;
      }
      CONVEYOR_CUSPARSE_RETURN_IF_ERROR(cusparseCsr2cscEx2(
          sparse, m, n, nnz, csr_values, csr_rowptr, csr_colind, csc_values, csc_colptr, csc_rowind, value_type,
          CUSPARSE_ACTION_NUMERIC, CUSPARSE_INDEX_BASE_ZERO, CUSPARSE_CSR2CSC_ALG1, transpose.data));
    }
    return absl::OkStatus();
  }

  absl::Status Enqueue(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* slot) {
    absl::StatusOr<AssemblyProgram> prog = BuildAssemblyProgram(plan, pieces);
    if (!prog.ok()) return prog.status();
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    StagingSet& set = sets[next];
    next ^= 1;
    // The pinned buffer was last sent two batches ago; wait until that copy is done.
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(set.sent));
    const uint64_t device_bytes = (prog->staging_bytes + 255) / 256 * 256 + prog->scratch_bytes;
    if (prog->staging_bytes > set.host.capacity || device_bytes > set.device.capacity) {
      CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the device mirror may be in use
      if (absl::Status st = set.host.Reserve(prog->staging_bytes, "pinned staging buffer"); !st.ok()) return st;
      if (absl::Status st = set.device.Reserve(device_bytes, "device staging buffer"); !st.ok()) return st;
    }
    PackStaging(*prog, set.host.data);
    std::byte* staging = set.device.data;
    std::byte* scratch = staging + (prog->staging_bytes + 255) / 256 * 256;
    CONVEYOR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staging, set.host.data, prog->staging_bytes, cudaMemcpyHostToDevice, stream));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventRecord(set.sent, stream));
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(slot, 0, prog->slot_bytes, stream));
    if (prog->scratch_bytes > 0) CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, prog->scratch_bytes, stream));
    if (prog->value_bytes == 4) return Launch<float>(*prog, staging, scratch, slot);
    return Launch<double>(*prog, staging, scratch, slot);
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

absl::Status CudaAssembler::AssembleAsync(const BatchPlan& plan, absl::Span<const PieceRef> pieces, std::byte* device_dst) {
  return impl_->Enqueue(plan, pieces, device_dst);
}

absl::StatusOr<uint64_t> CudaAssembler::Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                               absl::Span<std::byte> dst) {
  Impl& m = *impl_;
  if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, dst.data()));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    // Host memory goes through the one bounce buffer: assembled and copied back at once.
    if (absl::Status st = Assemble(plan, pieces, dst); !st.ok()) return st;
    m.pending.push_back({++m.begun, nullptr});
    return m.begun;
  }
  // Enqueue() copies all it reads from the pieces into pinned staging before it returns,
  // so only the device's work remains: an event marks its end.
  if (absl::Status st = m.Enqueue(plan, pieces, dst.data()); !st.ok()) return st;
  cudaEvent_t done = nullptr;
  if (!m.spare_events.empty()) {
    done = m.spare_events.back();
    m.spare_events.pop_back();
  } else {
    CONVEYOR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  if (cudaError_t e = cudaEventRecord(done, m.stream); e != cudaSuccess) {
    m.spare_events.push_back(done);
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
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaAssembler::Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) {
  if (absl::Status st = CheckSlotSize(plan, dst.size()); !st.ok()) return st;
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
  CONVEYOR_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst.data(), impl_->bounce.data, plan.total_bytes, cudaMemcpyDeviceToHost, impl_->stream));
  return Synchronize();
}

}  // namespace conveyor::gpu
