// cm_decode_plan.h: the host half of DeviceCmDecoder (kaldi_cm_device.h): whole Kaldi
// compressed matrices planned as CmDecodeKernel's jobs and tasks (kernels/cm_decode_kernel.h)
// and packed into one staging buffer; and the same kernel run on the host by the host
// executor, so that CI runs the decoder's device code. Pure C++: builds without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cuda/kaldi_cm_device.h"
#include "cuda/kernels/cm_decode_kernel.h"
#include "cuda/kernels/host_executor.h"

namespace conveyor::gpu {

struct CmDecodePlan {
  std::vector<CmJob> jobs;
  std::vector<CmTask> tasks;
  std::vector<size_t> job_of;  // jobs[i] decodes the caller's jobs[job_of[i]] (empty ones have none)
  uint64_t jobs_at = 0, tasks_at = 0, staging_bytes = 0;  // staging: payload, jobs, tasks
};

// Plans `jobs`. Errors: InvalidArgument (a job that is not a compressed matrix, or runs past
// its bytes). A plan without tasks has nothing to decode.
absl::StatusOr<CmDecodePlan> PlanCmDecode(absl::Span<const CompressedJob> jobs);

// Writes the staging buffer (plan.staging_bytes) for the plan of `jobs`.
void PackCmDecode(const CmDecodePlan& plan, absl::Span<const CompressedJob> jobs, std::byte* staging);

// CmDecodeKernel's launch for a plan (the device's, with `policy`).
inline LaunchShape CmDecodeShape(const CmDecodePlan& plan, const LaunchPolicy& policy) {
  return CmDecodeKernel::Shape(plan.tasks.size(), policy);
}

// Decodes `jobs` into `out` (floats, at each job's out_offset) with the device's kernel run
// by the host executor with `launch`. Errors: those of PlanCmDecode.
absl::Status DecodeCmOnHost(absl::Span<const CompressedJob> jobs, float* out, const HostLaunch& launch = {});

}  // namespace conveyor::gpu
