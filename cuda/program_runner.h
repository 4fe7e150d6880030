// program_runner.h: an assembly program's steps in their order, written once for the device
// (cuda_assembler.cu) and the host executor (host_program.cc), so that both run the same
// kernels (cuda/kernels/) with the same launch shapes, in the same order, with the same
// scans between them. A Backend provides:
//   LaunchPolicy policy() const;
//   template <class K> absl::Status Launch(const K& kernel, LaunchShape, const char* name);
//   template <class P> absl::Status ExclusiveScan(const P* in, uint64_t n, P* out);  // in != out
//   absl::Status Zero(std::byte* p, uint64_t bytes);
// Launch and ExclusiveScan are ordered: each step sees the previous steps' writes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/assembly_program.h"
#include "cuda/kernels/assembly_kernels.h"
#include "cuda/kernels/narrow_kernel.h"
#include "cuda/kernels/transpose_kernels.h"

namespace conveyor::gpu {

namespace program_runner_internal {

template <typename Backend, typename K>
absl::Status Launch(Backend& backend, const K& kernel, uint64_t work, const char* name, ProgramStats* stats) {
  ++stats->launches;
  return backend.Launch(kernel, K::Shape(work, backend.policy()), name);
}

template <typename T, typename Backend>
absl::Status Transpose(const TransposeOp& tr, std::byte* scratch, std::byte* slot, Backend& backend, ProgramStats* stats) {
  if (tr.nnz == 0) return absl::OkStatus();  // rowptr stays zero, as zeroed
  auto at = [&](uint64_t offset) { return scratch + offset; };
  auto* col_of = reinterpret_cast<int32_t*>(at(tr.col_of));
  const ColumnOfKernel column_of{reinterpret_cast<const int32_t*>(at(tr.csc_colptr)), tr.cols, tr.nnz, col_of};
  if (absl::Status st = Launch(backend, column_of, tr.nnz, "ColumnOfKernel", stats); !st.ok()) return st;
  const int32_t* keys = reinterpret_cast<const int32_t*>(at(tr.csc_rowind));
  const uint32_t* perm = nullptr;  // CSC order
  auto* hist = reinterpret_cast<uint32_t*>(at(tr.hist));
  auto* offsets = reinterpret_cast<uint32_t*>(at(tr.offsets));
  for (uint32_t pass = 0; pass < tr.passes; ++pass) {
    const uint32_t shift = pass * kRadixBits;
    const RadixHistogramKernel count{keys, tr.nnz, tr.tiles, shift, hist};
    if (absl::Status st = Launch(backend, count, tr.tiles, "RadixHistogramKernel", stats); !st.ok()) return st;
    ++stats->scans;
    if (absl::Status st = backend.ExclusiveScan(static_cast<const uint32_t*>(hist), kRadixBuckets * tr.tiles, offsets);
        !st.ok()) {
      return st;
    }
    auto* keys_out = reinterpret_cast<int32_t*>(at(tr.keys[pass % 2]));
    auto* perm_out = reinterpret_cast<uint32_t*>(at(tr.perm[pass % 2]));
    const RadixScatterKernel move{keys, perm, tr.nnz, tr.tiles, shift, offsets, keys_out, perm_out};
    if (absl::Status st = Launch(backend, move, tr.tiles, "RadixScatterKernel", stats); !st.ok()) return st;
    keys = keys_out;
    perm = perm_out;
  }
  const CsrGatherKernel<T> gather{perm, col_of, reinterpret_cast<const T*>(at(tr.csc_values)), tr.nnz,
                                  reinterpret_cast<int32_t*>(slot + tr.colind), reinterpret_cast<T*>(slot + tr.values)};
  if (absl::Status st = Launch(backend, gather, tr.nnz, "CsrGatherKernel", stats); !st.ok()) return st;
  const CsrRowPtrKernel rowptr{keys, tr.nnz, tr.dim, reinterpret_cast<int32_t*>(slot + tr.rowptr)};
  return Launch(backend, rowptr, tr.dim, "CsrRowPtrKernel", stats);
}

template <typename T, typename Backend>
absl::Status RunKernels(const AssemblyProgram& prog, const std::byte* staging, std::byte* scratch, std::byte* slot,
                        Backend& backend, ProgramStats* stats) {
  if (!prog.copies.empty()) {
    const CopyItemsKernel k{reinterpret_cast<const CopyItem*>(staging + prog.copies_at), prog.copies.size(), staging, slot};
    if (absl::Status st = Launch(backend, k, prog.copies.size(), "CopyItemsKernel", stats); !st.ok()) return st;
  }
  for (const ScanOp& scan : prog.scans) {
    std::byte* base = scan.in_scratch ? scratch : slot;
    ++stats->scans;
    absl::Status st = scan.wide ? backend.ExclusiveScan(reinterpret_cast<const int64_t*>(staging + scan.counts),
                                                        scan.cols + 1, reinterpret_cast<int64_t*>(base + scan.colptr))
                                : backend.ExclusiveScan(reinterpret_cast<const int32_t*>(staging + scan.counts),
                                                        scan.cols + 1, reinterpret_cast<int32_t*>(base + scan.colptr));
    if (!st.ok()) return st;
  }
  if (!prog.csc_pieces.empty()) {
    const CscPiecesKernel<T> k{reinterpret_cast<const CscPieceOp*>(staging + prog.csc_pieces_at), prog.csc_pieces.size(),
                               staging, slot, scratch};
    if (absl::Status st = Launch(backend, k, prog.csc_pieces.size(), "CscPiecesKernel", stats); !st.ok()) return st;
  }
  if (!prog.scatters.empty()) {
    const ScatterKernel<T> k{reinterpret_cast<const ScatterOp*>(staging + prog.scatters_at), prog.scatters.size(), staging,
                             slot};
    if (absl::Status st = Launch(backend, k, prog.scatters.size(), "ScatterKernel", stats); !st.ok()) return st;
  }
  if (!prog.decodes.empty()) {  // Kaldi compressed matrices left compressed in the chunks
    const DecodeOpsKernel<T> k{reinterpret_cast<const DecodeOp*>(staging + prog.decodes_at), prog.decodes.size(),
                               reinterpret_cast<const uint8_t*>(staging), slot};
    if (absl::Status st = Launch(backend, k, prog.decodes.size(), "DecodeOpsKernel", stats); !st.ok()) return st;
  }
  if (!prog.frames.empty()) {  // HTK frames left in their files, windows built here
    const FramesKernel<T> k{reinterpret_cast<const FramesOp*>(staging + prog.frames_at), prog.frames.size(),
                            reinterpret_cast<const uint8_t*>(staging), slot};
    if (absl::Status st = Launch(backend, k, prog.frames.size(), "FramesKernel", stats); !st.ok()) return st;
  }
  for (const TransposeOp& tr : prog.transposes) {
    if (absl::Status st = Transpose<T>(tr, scratch, slot, backend, stats); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace program_runner_internal

// Runs `prog` on `backend`: `staging` holds what PackStaging wrote (on the backend's side),
// `scratch` program.scratch_bytes of any content, `slot` program.slot_bytes (zeroed here,
// then filled). Adds what it ran to `*stats`. Errors: the backend's.
template <typename Backend>
absl::Status RunProgram(const AssemblyProgram& prog, const std::byte* staging, std::byte* scratch, std::byte* slot,
                        Backend& backend, ProgramStats* stats) {
  ++stats->programs;
  stats->copy_items += prog.copies.size();
  stats->csc_piece_ops += prog.csc_pieces.size();
  stats->scatter_ops += prog.scatters.size();
  stats->decode_ops += prog.decodes.size();
  for (const DecodeOp& op : prog.decodes) stats->decoded_values += uint64_t{op.rows} * op.cols;
  stats->frames_ops += prog.frames.size();
  for (const FramesOp& op : prog.frames) stats->frames_values += uint64_t{op.rows} * op.cols;
  stats->transposes += prog.transposes.size();
  stats->narrow_ops += prog.narrows.size();
  if (prog.narrows.empty()) {
    if (absl::Status st = backend.Zero(slot, prog.slot_bytes); !st.ok()) return st;
    if (prog.value_bytes == 4) return program_runner_internal::RunKernels<float>(prog, staging, scratch, slot, backend, stats);
    return program_runner_internal::RunKernels<double>(prog, staging, scratch, slot, backend, stats);
  }
  // Narrowed values (float data only): the float32 twin in scratch, then narrowed.
  std::byte* wide = scratch + prog.wide_at;
  if (absl::Status st = backend.Zero(wide, prog.wide_bytes); !st.ok()) return st;
  if (absl::Status st = program_runner_internal::RunKernels<float>(prog, staging, scratch, wide, backend, stats); !st.ok()) {
    return st;
  }
  if (absl::Status st = backend.Zero(slot, prog.slot_bytes); !st.ok()) return st;
  const NarrowKernel k{reinterpret_cast<const NarrowOp*>(staging + prog.narrows_at), prog.narrows.size(), wide, slot};
  return program_runner_internal::Launch(backend, k, prog.narrows.size(), "NarrowKernel", stats);
}

}  // namespace conveyor::gpu
