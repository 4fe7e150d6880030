// host_program.h: assembly programs (assembly_program.h) run on the CPU by the host executor
// (kernels/host_executor.h): the kernels' own code (cuda/kernels/), in the order and with the
// launch shapes the device uses (program_runner.h), so that CI, which has no GPU, runs what
// the device would. Only the scans between kernels are host code here (sequential exclusive
// scans: the result Thrust's exclusive_scan gives on the device). Pure C++: builds without
// CUDA.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "common/batch/assembler.h"
#include "cuda/assembly_program.h"
#include "cuda/kernels/host_executor.h"
#include "cuda/program_runner.h"

namespace conveyor::gpu {

// Runs `program` on the host with `launch` (the device's policy by default; tests use odd
// ones): `staging` as PackStaging wrote it, `scratch` program.scratch_bytes of any content,
// `slot` program.slot_bytes. Adds what ran to `*stats` when given. Never fails on a program
// BuildAssemblyProgram made.
void RunProgramOnHost(const AssemblyProgram& program, const std::byte* staging, std::byte* scratch, std::byte* slot,
                      const HostLaunch& launch = {}, ProgramStats* stats = nullptr);

// A BatchAssembler that builds the program and runs it with the host executor (`launch`):
// the CUDA assembler's kernels without a device. Its staging buffer is 256-byte aligned like
// the device's, and its scratch starts as garbage (as on the device, where it holds the
// previous batch's). Thread-compatible; `stats`, when given, must outlive it.
std::unique_ptr<BatchAssembler> MakeHostProgramAssembler(const HostLaunch& launch = {}, ProgramStats* stats = nullptr);

}  // namespace conveyor::gpu
