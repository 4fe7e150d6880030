// Compiled with --fmad=false (cuda/CMakeLists.txt): contraction would change 60-68% of the
// decoded values (measured with FMA contraction on the host, on Kaldi-written CM, CM2 and CM3
// archives).
#include "cuda/kaldi_cm_device.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/formats/kaldi/kaldi_cm_math.h"
#include "cuda/cuda_buffer.h"
#include "cuda/cuda_check.h"
#include "cuda/kaldi_cm_kernels.h"

namespace conveyor::gpu {
namespace {

constexpr int kThreads = 256;  // also the CM table size: one entry a thread
constexpr uint32_t kRowsPerTask = 16;

struct DeviceJob {
  uint64_t src = 0;  // staging offset of the data: CM column headers, CM2/CM3 values
  uint64_t out = 0;  // float offset
  uint32_t format = 1, rows = 0, cols = 0;
  float min_value = 0, range = 0;
};

// A CM column, or kRowsPerTask rows of a CM2/CM3 matrix.
struct Task {
  uint32_t job = 0, index = 0;
};

__device__ inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

__global__ void DecodeKernel(const DeviceJob* jobs, const Task* tasks, uint32_t n, const uint8_t* staging, float* out) {
  __shared__ float table[kThreads];
  for (uint32_t t = blockIdx.x; t < n; t += gridDim.x) {
    const Task task = tasks[t];
    const DeviceJob job = jobs[task.job];
    const uint8_t* src = staging + job.src;
    float* o = out + job.out;
    if (job.format == 1) {
      const uint32_t c = task.index;
      const uint8_t* h = src + 8 * uint64_t{c};
      const float p0 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h));
      const float p25 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 2));
      const float p75 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 4));
      const float p100 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 6));
      table[threadIdx.x] = kaldi::CmByte(p0, p25, p75, p100, static_cast<uint8_t>(threadIdx.x));
      __syncthreads();
      const uint8_t* column = src + 8 * uint64_t{job.cols} + uint64_t{c} * job.rows;
      for (uint32_t r = threadIdx.x; r < job.rows; r += blockDim.x) o[uint64_t{r} * job.cols + c] = table[column[r]];
      __syncthreads();  // the table is rewritten by the next task
    } else {
      const float inc = job.format == 2 ? kaldi::Cm2Increment(job.range) : kaldi::Cm3Increment(job.range);
      const uint64_t r0 = uint64_t{task.index} * kRowsPerTask;
      const uint64_t end = (r0 + kRowsPerTask < job.rows ? r0 + kRowsPerTask : job.rows) * job.cols;
      for (uint64_t k = r0 * job.cols + threadIdx.x; k < end; k += blockDim.x) {
        const uint32_t v = job.format == 2 ? LoadU16(src + 2 * k) : src[k];
        o[k] = kaldi::CmLinear(job.min_value, inc, v);
      }
    }
  }
}

}  // namespace

struct DeviceCmDecoder::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  CudaBuffer pinned{true}, staging{false};

  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    pinned.Free();
    staging.Free();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

DeviceCmDecoder::DeviceCmDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceCmDecoder::~DeviceCmDecoder() = default;

absl::StatusOr<std::unique_ptr<DeviceCmDecoder>> DeviceCmDecoder::Create(int device) {
  if (absl::Status st = CheckCudaDevice(device); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  return std::unique_ptr<DeviceCmDecoder>(new DeviceCmDecoder(std::move(impl)));
}

absl::Status DeviceCmDecoder::Decode(absl::Span<const CompressedJob> jobs, float* device_out) {
  std::vector<DeviceJob> djobs;
  std::vector<Task> tasks;
  uint64_t payload = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const kaldi::ObjectInfo& info = jobs[j].info;
    uint32_t format = 0, header = 0;
    switch (info.type) {
      case kaldi::ObjectType::kCompressed1: format = 1, header = 2 + 3 + 16; break;
      case kaldi::ObjectType::kCompressed2: format = 2, header = 2 + 4 + 16; break;
      case kaldi::ObjectType::kCompressed3: format = 3, header = 2 + 4 + 16; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("job ", j, " is a ", kaldi::ObjectTypeName(info.type),
                                                       ", not a compressed matrix"));
    }
    if (info.rows <= 0 || info.cols <= 0) continue;
    const uint64_t width = format == 2 ? 2 : 1;
    const uint64_t data_bytes = (format == 1 ? 8 * uint64_t(info.cols) : 0) + width * info.rows * info.cols;
    if (jobs[j].offset + header + data_bytes > jobs[j].bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("job ", j, ": the matrix runs past its bytes"));
    }
    DeviceJob d;
    d.src = payload;
    d.out = jobs[j].out_offset;
    d.format = format;
    d.rows = static_cast<uint32_t>(info.rows);
    d.cols = static_cast<uint32_t>(info.cols);
    d.min_value = info.min_value;
    d.range = info.range;
    const uint32_t n = format == 1 ? d.cols : (d.rows + kRowsPerTask - 1) / kRowsPerTask;
    for (uint32_t i = 0; i < n; ++i) tasks.push_back({static_cast<uint32_t>(djobs.size()), i});
    djobs.push_back(d);
    payload = (payload + data_bytes + 15) / 16 * 16;
  }
  if (tasks.empty()) return absl::OkStatus();
  const uint64_t jobs_at = payload;
  const uint64_t tasks_at = (jobs_at + djobs.size() * sizeof(DeviceJob) + 15) / 16 * 16;
  const uint64_t total = tasks_at + tasks.size() * sizeof(Task);
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));  // both buffers are free
  if (absl::Status st = impl_->pinned.Reserve(std::max<uint64_t>(total, 16 << 20), "pinned CM buffer"); !st.ok()) return st;
  if (absl::Status st = impl_->staging.Reserve(std::max<uint64_t>(total, 16 << 20), "device CM buffer"); !st.ok()) return st;
  size_t k = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const kaldi::ObjectInfo& info = jobs[j].info;
    if (info.rows <= 0 || info.cols <= 0) continue;
    const DeviceJob& d = djobs[k++];
    const uint64_t header = d.format == 1 ? 2 + 3 + 16 : 2 + 4 + 16;
    const uint64_t bytes = (d.format == 1 ? 8 * uint64_t{d.cols} : 0) + (d.format == 2 ? 2 : 1) * uint64_t{d.rows} * d.cols;
    std::memcpy(impl_->pinned.data + d.src, jobs[j].bytes.data() + jobs[j].offset + header, bytes);
  }
  std::memcpy(impl_->pinned.data + jobs_at, djobs.data(), djobs.size() * sizeof(DeviceJob));
  std::memcpy(impl_->pinned.data + tasks_at, tasks.data(), tasks.size() * sizeof(Task));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl_->staging.data, impl_->pinned.data, total, cudaMemcpyHostToDevice, impl_->stream));
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(tasks.size(), 65535));
  DecodeKernel<<<blocks, kThreads, 0, impl_->stream>>>(reinterpret_cast<const DeviceJob*>(impl_->staging.data + jobs_at),
                                                       reinterpret_cast<const Task*>(impl_->staging.data + tasks_at),
                                                       static_cast<uint32_t>(tasks.size()),
                                                       reinterpret_cast<const uint8_t*>(impl_->staging.data), device_out);
  CONVEYOR_CUDA_CHECK_LAUNCH("DecodeKernel");
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status DeviceCmDecoder::DecodeToHost(absl::Span<const CompressedJob> jobs, float* host_out, uint64_t out_floats) {
  float* device_out = nullptr;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMalloc(&device_out, std::max<uint64_t>(out_floats, 1) * sizeof(float)));
  std::unique_ptr<float, decltype(&cudaFree)> owned(device_out, &cudaFree);
  if (absl::Status st = Decode(jobs, device_out); !st.ok()) return st;
  CONVEYOR_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_out, device_out, out_floats * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

namespace {

// The assembler's decode ops: one block per op, one thread per value (row-major); CM values
// recompute their column's percentiles (cheap next to the memory traffic).
template <typename T>
__global__ void DecodeOpsKernel(const DecodeOp* ops, uint64_t n, const uint8_t* staging, std::byte* slot) {
  for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const DecodeOp op = ops[i];
    const uint8_t* src = staging + op.src;
    T* out = reinterpret_cast<T*>(slot + op.dst);
    const uint64_t count = uint64_t{op.rows} * op.cols;
    const float inc = op.type == 2 ? kaldi::Cm2Increment(op.range) : kaldi::Cm3Increment(op.range);
    for (uint64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const uint64_t r = k / op.cols, c = k % op.cols;
      float v;
      if (op.type == 1) {
        const uint8_t* h = src + 8 * c;
        const float p0 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h));
        const float p25 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 2));
        const float p75 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 4));
        const float p100 = kaldi::CmPercentile(op.min_value, op.range, LoadU16(h + 6));
        v = kaldi::CmByte(p0, p25, p75, p100, src[8 * uint64_t{op.cols} + c * op.rows + r]);
      } else if (op.type == 2) {
        v = kaldi::CmLinear(op.min_value, inc, LoadU16(src + 2 * k));
      } else {
        v = kaldi::CmLinear(op.min_value, inc, src[k]);
      }
      out[k] = static_cast<T>(v);
    }
  }
}

}  // namespace

cudaError_t LaunchDecodeOps(const DecodeOp* ops, uint64_t n, const std::byte* staging, std::byte* slot, bool double_values,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(n, 65535));
  const auto* bytes = reinterpret_cast<const uint8_t*>(staging);
  if (double_values) DecodeOpsKernel<double><<<blocks, kThreads, 0, stream>>>(ops, n, bytes, slot);
  else DecodeOpsKernel<float><<<blocks, kThreads, 0, stream>>>(ops, n, bytes, slot);
  return cudaGetLastError();
}

}  // namespace conveyor::gpu
