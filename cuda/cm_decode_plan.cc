// DeviceCmDecoder's host half. Compiled with -ffp-contract=off (cuda/CMakeLists.txt): the
// kernel's Kaldi arithmetic must not be contracted on the host either.
#include "cuda/cm_decode_plan.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor::gpu {
namespace {

// Bytes before a matrix's data: marker "\0B", token "CM " or "CM2 "/"CM3 ", global header.
uint64_t HeaderBytes(uint32_t format) { return format == 1 ? 2 + 3 + 16 : 2 + 4 + 16; }

uint64_t DataBytes(const CmJob& d) {
  return (d.format == 1 ? 8 * uint64_t{d.cols} : 0) + (d.format == 2 ? 2 : 1) * uint64_t{d.rows} * d.cols;
}

}  // namespace

absl::StatusOr<CmDecodePlan> PlanCmDecode(absl::Span<const CompressedJob> jobs) {
  CmDecodePlan plan;
  uint64_t payload = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const kaldi::ObjectInfo& info = jobs[j].info;
    uint32_t format = 0;
    switch (info.type) {
      case kaldi::ObjectType::kCompressed1: format = 1; break;
      case kaldi::ObjectType::kCompressed2: format = 2; break;
      case kaldi::ObjectType::kCompressed3: format = 3; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("job ", j, " is a ", kaldi::ObjectTypeName(info.type),
                                                       ", not a compressed matrix"));
    }
    if (info.rows <= 0 || info.cols <= 0) continue;
    CmJob d;
    d.src = payload;
    d.out = jobs[j].out_offset;
    d.format = format;
    d.rows = static_cast<uint32_t>(info.rows);
    d.cols = static_cast<uint32_t>(info.cols);
    d.min_value = info.min_value;
    d.range = info.range;
    if (jobs[j].offset + HeaderBytes(format) + DataBytes(d) > jobs[j].bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("job ", j, ": the matrix runs past its bytes"));
    }
    const uint32_t n = format == 1 ? d.cols : (d.rows + kCmRowsPerTask - 1) / kCmRowsPerTask;
    for (uint32_t i = 0; i < n; ++i) plan.tasks.push_back({static_cast<uint32_t>(plan.jobs.size()), i});
    plan.jobs.push_back(d);
    plan.job_of.push_back(j);
    payload = (payload + DataBytes(d) + 15) / 16 * 16;
  }
  plan.jobs_at = payload;
  plan.tasks_at = (plan.jobs_at + plan.jobs.size() * sizeof(CmJob) + 15) / 16 * 16;
  plan.staging_bytes = plan.tasks_at + plan.tasks.size() * sizeof(CmTask);
  return plan;
}

void PackCmDecode(const CmDecodePlan& plan, absl::Span<const CompressedJob> jobs, std::byte* staging) {
  for (size_t i = 0; i < plan.jobs.size(); ++i) {
    const CmJob& d = plan.jobs[i];
    const CompressedJob& j = jobs[plan.job_of[i]];
    std::memcpy(staging + d.src, j.bytes.data() + j.offset + HeaderBytes(d.format), DataBytes(d));
  }
  if (!plan.jobs.empty()) std::memcpy(staging + plan.jobs_at, plan.jobs.data(), plan.jobs.size() * sizeof(CmJob));
  if (!plan.tasks.empty()) std::memcpy(staging + plan.tasks_at, plan.tasks.data(), plan.tasks.size() * sizeof(CmTask));
}

absl::Status DecodeCmOnHost(absl::Span<const CompressedJob> jobs, float* out, const HostLaunch& launch) {
  absl::StatusOr<CmDecodePlan> plan = PlanCmDecode(jobs);
  if (!plan.ok()) return plan.status();
  if (plan->tasks.empty()) return absl::OkStatus();
  std::vector<std::byte> staging(plan->staging_bytes + 16);
  // 16-byte aligned, as device memory is (the jobs hold 64-bit fields).
  std::byte* at = staging.data() + (16 - reinterpret_cast<uintptr_t>(staging.data()) % 16) % 16;
  PackCmDecode(*plan, jobs, at);
  const CmDecodeKernel kernel{reinterpret_cast<const CmJob*>(at + plan->jobs_at),
                              reinterpret_cast<const CmTask*>(at + plan->tasks_at),
                              static_cast<uint32_t>(plan->tasks.size()), reinterpret_cast<const uint8_t*>(at), out};
  RunPhasedOnHost(kernel, CmDecodeShape(*plan, launch.policy), launch.order);
  return absl::OkStatus();
}

}  // namespace conveyor::gpu
