// cm_decode_kernel.h: the body of DeviceCmDecoder's kernel (kaldi_cm_device.h), whole Kaldi
// compressed matrices decoded to floats, as a phased host/device kernel (host_executor.h):
// one block per task (a CM column, or kCmRowsPerTask rows of a CM2/CM3 matrix); for a CM
// column, phase 0 fills a 256-entry table in shared memory (the column's value of every
// byte), phase 1 looks the column's bytes up in it. Compile without contraction (device
// --fmad=false, host -ffp-contract=off) for Kaldi's values bit for bit.
#pragma once

#include <cstdint>

#include "common/formats/kaldi/kaldi_cm_math.h"
#include "cuda/kernels/assembly_kernels.h"
#include "cuda/kernels/grid.h"

namespace conveyor::gpu {

inline constexpr uint32_t kCmRowsPerTask = 16;

// One matrix: its data at staging offset `src` (CM: column headers, then bytes column by
// column; CM2/CM3: values row-major), decoded row-major to float offset `out`.
struct CmJob {
  uint64_t src = 0;
  uint64_t out = 0;
  uint32_t format = 1, rows = 0, cols = 0;
  float min_value = 0, range = 0;
};

// Column `index` of a CM job, or rows [index * kCmRowsPerTask, +kCmRowsPerTask) of a CM2/CM3.
struct CmTask {
  uint32_t job = 0, index = 0;
};

struct CmDecodeKernel {
  static constexpr int kPhases = 2;
  struct Shared {
    float table[256];
  };

  const CmJob* jobs;
  const CmTask* tasks;
  uint32_t n;
  const uint8_t* staging;
  float* out;

  static LaunchShape Shape(uint64_t tasks, const LaunchPolicy& p) { return BlockPerItem(tasks, p); }
  CONVEYOR_HD uint64_t steps() const { return n; }

  CONVEYOR_HD void operator()(int phase, uint64_t step, const Grid& g, Shared& s) const {
    const CmTask task = tasks[step];
    const CmJob job = jobs[task.job];
    const uint8_t* src = staging + job.src;
    float* o = out + job.out;
    if (job.format == 1) {
      const uint32_t c = task.index;
      if (phase == 0) {
        const uint8_t* h = src + 8 * uint64_t{c};
        const float p0 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h));
        const float p25 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 2));
        const float p75 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 4));
        const float p100 = kaldi::CmPercentile(job.min_value, job.range, LoadU16(h + 6));
        for (uint32_t v = g.thread; v < 256; v += g.block_dim) {
          s.table[v] = kaldi::CmByte(p0, p25, p75, p100, static_cast<uint8_t>(v));
        }
      } else {  // after the barrier: the table is complete; the next step rewrites it after another
        const uint8_t* column = src + 8 * uint64_t{job.cols} + uint64_t{c} * job.rows;
        for (uint32_t r = g.thread; r < job.rows; r += g.block_dim) o[uint64_t{r} * job.cols + c] = s.table[column[r]];
      }
    } else if (phase == 0) {
      const float inc = job.format == 2 ? kaldi::Cm2Increment(job.range) : kaldi::Cm3Increment(job.range);
      const uint64_t r0 = uint64_t{task.index} * kCmRowsPerTask;
      const uint64_t end = (r0 + kCmRowsPerTask < job.rows ? r0 + kCmRowsPerTask : job.rows) * job.cols;
      for (uint64_t k = r0 * job.cols + g.thread; k < end; k += g.block_dim) {
        const uint32_t v = job.format == 2 ? LoadU16(src + 2 * k) : src[k];
        o[k] = kaldi::CmLinear(job.min_value, inc, v);
      }
    }
  }
};

}  // namespace conveyor::gpu
