// The host half of GPU assembly: building and packing a program.
#include "cuda/assembly_program.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/formats/htk/htk_features.h"
#include "common/formats/kaldi/kaldi_object.h"
#include "cuda/kernels/assembly_kernels.h"

namespace conveyor::gpu {
namespace {

uint64_t Align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Appends `bytes` of host-computed data to the staged host arrays; returns its offset.
uint64_t AddHostArray(std::vector<std::byte>* arrays, const void* data, uint64_t bytes) {
  const uint64_t at = Align(arrays->size(), 16);
  arrays->resize(at + bytes);
  if (bytes > 0) std::memcpy(arrays->data() + at, data, bytes);
  return at;
}

// Adds a staged -> slot copy, merged with the previous one when both ends are contiguous,
// split so no item exceeds kCopyItemBytes.
void AddCopy(std::vector<CopyItem>* copies, uint64_t src, uint64_t dst, uint64_t bytes) {
  while (bytes > 0) {
    if (!copies->empty()) {
      CopyItem& last = copies->back();
      if (last.src + last.bytes == src && last.dst + last.bytes == dst && last.bytes < kCopyItemBytes) {
        const uint64_t take = std::min(bytes, kCopyItemBytes - last.bytes);
        last.bytes += take;
        src += take, dst += take, bytes -= take;
        continue;
      }
    }
    const uint64_t take = std::min(bytes, kCopyItemBytes);
    copies->push_back({src, dst, take});
    src += take, dst += take, bytes -= take;
  }
}

// Header bytes before a compressed matrix's data: marker "\0B", token "CM " or "CM2 "/"CM3 ",
// the 16-byte global header.
constexpr uint64_t kCm1Data = 2 + 3 + 16, kCm23Data = 2 + 4 + 16;

}  // namespace

namespace {

// Builds the program of a batch without narrowed values, phase by phase: the host-computed
// arrays (BPTT mask and flags, lengths, per-column nnz with their scans and CSR transposes),
// then every stream's pieces packed into staging with the ops that place them, then the
// staging layout.
class ProgramBuilder {
 public:
  ProgramBuilder(const BatchPlan& plan, absl::Span<const PieceRef> pieces) : plan_(plan), pieces_(pieces) {
    prog_.precision = plan.precision;
    prog_.value_bytes = plan.precision == Precision::kFloat ? 4 : 8;
    prog_.slot_bytes = plan.total_bytes;
    vb_ = prog_.value_bytes;
    rows_ = plan.shape.rows;
    scan_of_.assign(plan.streams.size(), UINT64_MAX);
    transpose_of_.assign(plan.streams.size(), UINT64_MAX);
  }

  absl::StatusOr<AssemblyProgram> Build() {
    if (pieces_.size() != plan_.pieces.size() || plan_.counts.size() != pieces_.size() * plan_.streams.size()) {
      return absl::InvalidArgumentError(absl::StrCat("the batch plan has ", plan_.pieces.size(), " pieces; ",
                                                     pieces_.size(), " were given"));
    }
    if (plan_.mask.present()) {
      absl::Status st = AddMaskAndFlags();
      if (!st.ok()) return st;
    }
    for (size_t s = 0; s < plan_.streams.size(); ++s) {
      absl::Status st = AddStreamArrays(s);
      if (!st.ok()) return st;
    }
    // Chunk data, packed piece by piece after the host arrays.
    cursor_ = prog_.host_arrays.size();
    for (size_t s = 0; s < plan_.streams.size(); ++s) {
      FlushRun();
      for (size_t i = 0; i < pieces_.size(); ++i) AddPiece(s, i);
    }
    FlushRun();
    LayOutStaging();
    return std::move(prog_);
  }

 private:
  // Host-computed arrays: the BPTT mask and begin/end flags.
  absl::Status AddMaskAndFlags() {
    const uint64_t T = plan_.shape.steps;
    std::vector<uint8_t> mask(rows_ * T, 0), flags(rows_ * T, 0);
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const uint32_t c = plan_.pieces[i].longest;
      const uint64_t at = pieces_[i].row * T + pieces_[i].t0;
      if (at + c > mask.size()) return absl::InvalidArgumentError("a BPTT piece lies outside the batch");
      std::memset(mask.data() + at, 1, c);
      if (c > 0 && pieces_[i].begins) flags[at] |= 1;
      if (c > 0 && pieces_[i].ends) flags[at + c - 1] |= 2;
    }
    AddCopy(&prog_.copies, AddHostArray(&prog_.host_arrays, mask.data(), mask.size()), plan_.mask.offset, mask.size());
    AddCopy(&prog_.copies, AddHostArray(&prog_.host_arrays, flags.data(), flags.size()), plan_.flags.offset, flags.size());
    return absl::OkStatus();
  }

  // Stream s's lengths, and for a sparse stream delivered sparse its ScanOp (and, CSR, its
  // TransposeOp).
  absl::Status AddStreamArrays(size_t s) {
    const StreamLayout& L = plan_.streams[s];
    const uint64_t T = L.sequence_axis ? L.max_length : 1;
    if (L.lengths.present()) {
      std::vector<int32_t> lengths(rows_, 0);
      for (size_t i = 0; i < pieces_.size(); ++i) {
        const int32_t end = static_cast<int32_t>(pieces_[i].t0 + plan_.count(i, s));
        lengths[pieces_[i].row] = std::max(lengths[pieces_[i].row], end);
      }
      AddCopy(&prog_.copies, AddHostArray(&prog_.host_arrays, lengths.data(), rows_ * 4), L.lengths.offset, rows_ * 4);
    }
    if (L.format != StreamFormat::kSparse || L.dense_values()) return absl::OkStatus();
    if (L.csr() && L.nnz > static_cast<uint64_t>(INT32_MAX)) {
      return absl::ResourceExhaustedError(absl::StrCat("stream '", L.name, "': ", L.nnz,
                                                       " entries are too many for CSR on the device (int32 offsets)"));
    }
    const uint64_t cols = L.columns(rows_);
    const bool wide = L.csc() && L.colptr.dtype == DType::kInt64;
    std::vector<int64_t> counts(cols + 1, 0);
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const PieceRef& p = pieces_[i];
      uint64_t b;
      const uint32_t c = PieceSamples(p, s, &b);
      const uint64_t first = p.row * T + p.t0;
      if (first + c > cols) return absl::InvalidArgumentError("a piece lies outside the batch");
      const ParsedStream& ps = p.chunk->streams[s];
      for (uint32_t t = 0; t < c; ++t) counts[first + t] = static_cast<int64_t>(ps.nnz_begin[b + t + 1] - ps.nnz_begin[b + t]);
    }
    ScanOp scan;
    scan.cols = cols;
    scan.wide = wide;
    if (wide) {
      scan.counts = AddHostArray(&prog_.host_arrays, counts.data(), (cols + 1) * 8);
    } else {
      std::vector<int32_t> narrow(counts.begin(), counts.end());
      scan.counts = AddHostArray(&prog_.host_arrays, narrow.data(), (cols + 1) * 4);
    }
    if (L.csr()) {
      AddTranspose(s, cols);
      scan.colptr = prog_.transposes.back().csc_colptr;
      scan.in_scratch = 1;
    } else {
      scan.colptr = L.colptr.offset;
    }
    scan_of_[s] = prog_.scans.size();
    prog_.scans.push_back(scan);
    return absl::OkStatus();
  }

  // A CSR stream's transpose: the CSC it is built from and the stable radix sort's arrays
  // (program_ops.h), in scratch.
  void AddTranspose(size_t s, uint64_t cols) {
    const StreamLayout& L = plan_.streams[s];
    TransposeOp tr;
    tr.cols = cols;
    tr.dim = L.dim;
    tr.nnz = L.nnz;
    tr.csc_colptr = Align(prog_.scratch_bytes, kArrayAlignment);
    tr.csc_rowind = Align(tr.csc_colptr + (cols + 1) * 4, kArrayAlignment);
    tr.csc_values = Align(tr.csc_rowind + L.nnz * 4, kArrayAlignment);
    // As many 8-bit digits as rows need.
    uint32_t bits = 0;
    while (bits < 32 && (uint64_t{1} << bits) < L.dim) ++bits;
    tr.passes = (bits + kRadixBits - 1) / kRadixBits;
    tr.tiles = (L.nnz + kSortTile - 1) / kSortTile;
    uint64_t at = tr.csc_values + L.nnz * vb_;
    auto take = [&](uint64_t bytes) {
      const uint64_t offset = Align(at, kArrayAlignment);
      at = offset + bytes;
      return offset;
    };
    tr.col_of = take(L.nnz * 4);
    for (int i = 0; i < 2; ++i) {
      tr.keys[i] = take(L.nnz * 4);
      tr.perm[i] = take(L.nnz * 4);
    }
    tr.hist = take(kRadixBuckets * tr.tiles * 4);
    tr.offsets = take(kRadixBuckets * tr.tiles * 4);
    prog_.scratch_bytes = Align(at, kArrayAlignment);
    tr.rowptr = L.rowptr.offset;
    tr.colind = L.colind.offset;
    tr.values = L.values.offset;
    transpose_of_[s] = prog_.transposes.size();
    prog_.transposes.push_back(tr);
  }

  // Packs `bytes` from `src` into staging at the next 16-byte boundary; returns where.
  uint64_t Pack(const void* src, uint64_t bytes) {
    cursor_ = Align(cursor_, 16);
    const uint64_t at = cursor_;
    if (bytes > 0) prog_.packs.push_back({src, at, bytes, nullptr, {}});
    cursor_ += bytes;
    return at;
  }
  // Packs right after the previous pack.
  void PackNext(const void* src, uint64_t bytes) {
    if (!prog_.packs.empty() && prog_.packs.back().decode == nullptr &&
        static_cast<const char*>(prog_.packs.back().src) + prog_.packs.back().bytes == src &&
        prog_.packs.back().dst + prog_.packs.back().bytes == cursor_) {
      prog_.packs.back().bytes += bytes;  // contiguous in the source too: one pack
    } else if (bytes > 0) {
      prog_.packs.push_back({src, cursor_, bytes, nullptr, {}});
    }
    cursor_ += bytes;
  }

  // Piece i's samples of stream s: packed, with the op that places them.
  void AddPiece(size_t s, size_t i) {
    const StreamLayout& L = plan_.streams[s];
    const uint64_t T = L.sequence_axis ? L.max_length : 1;
    const PieceRef& p = pieces_[i];
    const ParsedStream& ps = p.chunk->streams[s];
    uint64_t b;
    const uint32_t c = PieceSamples(p, s, &b);
    if (c == 0) return;
    const uint64_t col = p.row * T + p.t0;
    if (L.ids()) {
      AddCopy(&prog_.copies, Pack(ps.indices.data() + b, c * 4ull), L.values.offset + col * 4, c * 4ull);
    } else if (L.format == StreamFormat::kDense && !ps.compressed.empty()) {
      // Consecutive rows of one matrix landing consecutively (frames read in order, a
      // sequence's BPTT pieces) become one decode op: one header block, longer column runs.
      // One matrix: the same entry of the chunk (payloads of one file may share their object:
      // HTK's is the file's first byte).
      const CompressedDense& m = ps.compressed[p.slot];
      const uint64_t r0 = b - ps.sequence_begin[p.slot], dst = L.values.offset + col * L.dim * vb_;
      if (run_.rows > 0 && run_.matrix == &m && run_.r0 + run_.rows == r0 &&
          run_.dst + run_.rows * L.dim * vb_ == dst) {
        run_.rows += c;
        return;
      }
      FlushRun();
      run_ = {&m, r0, c, L.dim, dst};
    } else if (L.format == StreamFormat::kDense) {
      const uint64_t bytes = uint64_t{c} * L.dim * vb_;
      AddCopy(&prog_.copies, Pack(ps.DenseSamples(p.slot, b, vb_), bytes), L.values.offset + col * L.dim * vb_, bytes);
    } else {
      AddSparsePiece(s, ps, p.slot, b, c, col);
    }
  }

  // Samples [b, b + c) of sparse stream s landing at column `col`: summed into dense rows
  // (ScatterOps) or placed into the CSC (CscPieceOps).
  void AddSparsePiece(size_t s, const ParsedStream& ps, uint32_t slot, uint64_t b, uint32_t c, uint64_t col) {
    const StreamLayout& L = plan_.streams[s];
    const uint64_t nb = ps.nnz_begin[b], nnz = ps.nnz_begin[b + c] - nb;
    if (nnz == 0) return;
    // From the chunk's columns, or from the mapped file where the entries lie (CBF).
    const uint64_t rowind = Pack(ps.SparseIndexBytes(slot, nb), nnz * 4);
    const uint64_t values = Pack(ps.SparseValueBytes(slot, nb, vb_), nnz * vb_);
    if (L.dense_values()) {
      for (uint32_t t = 0; t < c; ++t) {
        const uint64_t k0 = ps.nnz_begin[b + t] - nb, n = ps.nnz_begin[b + t + 1] - ps.nnz_begin[b + t];
        if (n == 0) continue;
        // A long sample: row bands, one thread each (ScatterOp), sums still in file order.
        uint64_t bands = std::min<uint64_t>((n + kScatterBandEntries - 1) / kScatterBandEntries, kMaxScatterBands);
        bands = std::max<uint64_t>(1, std::min<uint64_t>(bands, L.dim));
        for (uint64_t band = 0; band < bands; ++band) {
          prog_.scatters.push_back({rowind + k0 * 4, values + k0 * vb_, n, L.values.offset + (col + t) * L.dim * vb_,
                                    static_cast<uint32_t>(band), static_cast<uint32_t>(bands)});
        }
      }
      return;
    }
    const ScanOp& scan = prog_.scans[scan_of_[s]];
    CscPieceOp op;
    op.src_rowind = rowind;
    op.src_values = values;
    op.nnz = nnz;
    op.first_col = col;
    op.colptr = scan.colptr;
    op.wide = scan.wide;
    op.in_scratch = scan.in_scratch;
    if (scan.in_scratch) {
      const TransposeOp& tr = prog_.transposes[transpose_of_[s]];
      op.rowind = tr.csc_rowind;
      op.values = tr.csc_values;
    } else {
      op.rowind = L.rowind.offset;
      op.values = L.values.offset;
    }
    // At most kCscPieceEntries entries an op (one block each).
    for (uint64_t skip = 0; skip < nnz; skip += kCscPieceEntries) {
      CscPieceOp part = op;
      part.src_rowind = rowind + skip * 4;
      part.src_values = values + skip * vb_;
      part.nnz = std::min(kCscPieceEntries, nnz - skip);
      part.skip = skip;
      prog_.csc_pieces.push_back(part);
    }
  }

  void FlushRun() {
    if (run_.rows > 0) PackCompressed(*run_.matrix, run_.r0, run_.rows, run_.cols, run_.dst);
    run_.rows = 0;
  }

  // Whether the device's arithmetic gives Kaldi's bits for a matrix of this header: always,
  // but where a result is NaN, whose bits IEEE leaves open (the device gives its canonical
  // NaN, x86 the first NaN operand's or 0xffc00000). Kaldi's operations give a NaN only from a
  // non-finite header or percentiles that overflow (inf - inf); with a finite minimum and
  // range whose magnitudes sum to at most 1e38 every percentile and difference is finite, so
  // no value is NaN. Other headers (a matrix compressed from data with a NaN or an inf in it)
  // are decoded on the host.
  static bool DeviceDecodesAlike(const kaldi::ObjectInfo& info) {
    return std::isfinite(info.min_value) && std::isfinite(info.range) &&
           std::fabs(info.min_value) + std::fabs(info.range) <= 1e38f;
  }

  // Rows [r0, r0 + n) of a compressed matrix: the stored bytes the decode op reads, or (a few
  // rows of CM, or a header DeviceDecodesAlike refuses) the rows decoded here.
  void PackCompressed(const CompressedDense& m, uint64_t r0, uint64_t n, uint64_t cols, uint64_t dst) {
    if (m.info.codec == HtkFramesCodecTag()) {
      PackFrames(m, r0, n, cols, dst);
      return;
    }
    // Payloads of any other codec are decoded here, as the CPU assembler does.
    if (m.info.codec != kaldi::CompressedCodecTag()) {
      DecodeOnHost(m, r0, n, cols, dst);
      return;
    }
    const kaldi::ObjectInfo info = kaldi::CompressedObjectInfo(m.info);  // the codec's header: Kaldi's
    if ((info.type == kaldi::ObjectType::kCompressed1 && n < kCm1DeviceMinRows) || !DeviceDecodesAlike(info)) {
      DecodeOnHost(m, r0, n, cols, dst);
      return;
    }
    DecodeOp op;
    op.dst = dst;
    op.rows = static_cast<uint32_t>(n);
    op.cols = static_cast<uint32_t>(cols);
    op.column_rows = static_cast<uint32_t>(n);
    op.min_value = info.min_value;
    op.range = info.range;
    const uint64_t R = static_cast<uint64_t>(info.rows), C = static_cast<uint64_t>(info.cols);
    const uint64_t row = static_cast<uint64_t>(m.row0) + r0, col0 = static_cast<uint64_t>(m.col0);
    if (info.type == kaldi::ObjectType::kCompressed1) {
      op.type = 1;
      op.src = Pack(m.object + kCm1Data + 8 * col0, 8 * cols);  // the columns' headers
      const char* data = m.object + kCm1Data + 8 * C;
      for (uint64_t c = col0; c < col0 + cols; ++c) PackNext(data + c * R + row, n);
    } else {
      const uint64_t width = info.type == kaldi::ObjectType::kCompressed2 ? 2 : 1;
      op.type = width == 2 ? 2 : 3;
      const char* data = m.object + kCm23Data;
      op.src = Pack(data + width * (row * C + col0), 0);
      for (uint64_t r = row; r < row + n; ++r) PackNext(data + width * (r * C + col0), width * cols);
    }
    // At most kDecodeOpValues values an op (one block each): bands of rows. CM bands share
    // the staged column headers and columns; CM2/CM3 bands start at their own rows.
    const uint64_t band = std::max<uint64_t>(1, kDecodeOpValues / std::max<uint64_t>(cols, 1));
    const uint64_t width = op.type == 2 ? 2 : 1;
    for (uint64_t r = 0; r < n; r += band) {
      DecodeOp part = op;
      part.rows = static_cast<uint32_t>(std::min(band, n - r));
      part.dst = dst + r * cols * vb_;
      if (op.type == 1) part.row0 = static_cast<uint32_t>(r);
      else part.src = op.src + width * r * cols;
      prog_.decodes.push_back(part);
    }
  }

  // Rows [r0, r0 + n) of an HTK utterance's windows (columns m.col0 .. + cols): the frames
  // they read staged once, as they lie in the file (1/w of the rows' bytes for a window of w
  // frames), and frames ops that build the rows on the device; or, where that would send
  // more bytes than the rows decoded here (no window, or one frame of a window: a frames op
  // is 80 bytes, a copy item 24), the rows decoded here.
  void PackFrames(const CompressedDense& m, uint64_t r0, uint64_t n, uint64_t cols, uint64_t dst) {
    const HtkFramesPayload p = m.info.Load<HtkFramesPayload>();
    const int64_t t0 = m.row0 + static_cast<int64_t>(r0);
    const int64_t first = std::max<int64_t>(0, t0 - p.left);
    const int64_t last = std::min<int64_t>(p.frames - 1, t0 + static_cast<int64_t>(n) - 1 + p.right);
    const uint64_t value_bytes = p.compressed ? 2 : 4;
    // At most kDecodeOpValues values an op (one block each): bands of rows, sharing the frames.
    const uint64_t band = std::max<uint64_t>(1, kDecodeOpValues / std::max<uint64_t>(cols, 1));
    const uint64_t sent = static_cast<uint64_t>(last - first + 1) * p.dim * value_bytes +
                          (p.compressed ? uint64_t{8} * p.dim : 0) + (n + band - 1) / band * sizeof(FramesOp);
    if (last < first || sent >= n * cols * vb_ + sizeof(CopyItem)) {  // (no frame to send: not from a scanned payload)
      DecodeOnHost(m, r0, n, cols, dst);
      return;
    }
    FramesOp op;
    if (p.compressed) op.scale = Pack(m.object + 12, uint64_t{8} * p.dim);  // A, then B
    op.src = Pack(m.object + p.first + static_cast<uint64_t>(first) * p.dim * value_bytes,
                  static_cast<uint64_t>(last - first + 1) * p.dim * value_bytes);
    op.first = first;
    op.last = p.frames - 1;
    op.col0 = static_cast<uint32_t>(m.col0);
    op.cols = static_cast<uint32_t>(cols);
    op.dim = p.dim;
    op.big_endian = p.big_endian;
    op.compressed = p.compressed;
    op.default_nan = default_nan_;
    for (uint64_t r = 0; r < n; r += band) {
      FramesOp part = op;
      part.rows = static_cast<uint32_t>(std::min(band, n - r));
      part.base = t0 + static_cast<int64_t>(r) - p.left;
      part.dst = dst + r * cols * vb_;
      prog_.frames.push_back(part);
    }
  }

  // Rows decoded here by their codec, bit for bit as the CPU assembler does (a few rows of CM,
  // or a payload no device kernel decodes), and copied like dense values.
  void DecodeOnHost(const CompressedDense& m, uint64_t r0, uint64_t n, uint64_t cols, uint64_t dst) {
    CompressedWindow w;
    w.row0 = m.row0 + static_cast<int64_t>(r0);
    w.rows = static_cast<int64_t>(n);
    w.col0 = m.col0;
    w.cols = static_cast<int64_t>(cols);
    // Decoded by PackStaging straight into the staging buffer (not into a buffer of the
    // program's and copied from there: a second pass over rows that may be window-fold the
    // input's), right after the rows decoded before them, so that frames decoded one after
    // another also copy as one (and stay aligned to their values).
    const uint64_t bytes = n * cols * vb_;
    const bool follows = !prog_.packs.empty() && prog_.packs.back().decode != nullptr &&
                         prog_.packs.back().dst + prog_.packs.back().bytes == cursor_;
    if (!follows) cursor_ = Align(cursor_, 16);
    const uint64_t at = cursor_;
    HostPack pack;
    pack.dst = at;
    pack.bytes = bytes;
    pack.decode = &m;
    pack.window = w;
    prog_.packs.push_back(pack);
    cursor_ += bytes;
    AddCopy(&prog_.copies, at, dst, bytes);
  }

  // Staging: the payload, then the op arrays, each 16-byte aligned.
  void LayOutStaging() {
    prog_.payload_bytes = Align(cursor_, 16);
    prog_.copies_at = prog_.payload_bytes;
    prog_.csc_pieces_at = Align(prog_.copies_at + prog_.copies.size() * sizeof(CopyItem), 16);
    prog_.scatters_at = Align(prog_.csc_pieces_at + prog_.csc_pieces.size() * sizeof(CscPieceOp), 16);
    prog_.decodes_at = Align(prog_.scatters_at + prog_.scatters.size() * sizeof(ScatterOp), 16);
    prog_.frames_at = Align(prog_.decodes_at + prog_.decodes.size() * sizeof(DecodeOp), 16);
    prog_.staging_bytes = Align(prog_.frames_at + prog_.frames.size() * sizeof(FramesOp), 16);
  }

  const BatchPlan& plan_;
  const absl::Span<const PieceRef> pieces_;
  AssemblyProgram prog_;
  uint64_t vb_ = 4, rows_ = 0;
  // Per stream: its ScanOp, and for CSR streams its TransposeOp (else UINT64_MAX).
  std::vector<uint64_t> scan_of_, transpose_of_;
  uint64_t cursor_ = 0;        // the next free byte of staging
  const uint32_t default_nan_ = HostDefaultNan();
  struct CompressedRun {       // rows [r0, r0 + rows) of one matrix, decoded to `dst` on
    const CompressedDense* matrix = nullptr;
    uint64_t r0 = 0, rows = 0, cols = 0, dst = 0;
  } run_;
};

// The program of a batch without narrowed values.
absl::StatusOr<AssemblyProgram> BuildProgramFor(const BatchPlan& plan, absl::Span<const PieceRef> pieces) {
  return ProgramBuilder(plan, pieces).Build();
}

}  // namespace

absl::StatusOr<AssemblyProgram> BuildAssemblyProgram(const BatchPlan& plan, absl::Span<const PieceRef> pieces) {
  if (!NarrowsValues(plan)) return BuildProgramFor(plan, pieces);
  // The float32 twin in scratch, then narrowed into the slot (value_conversion.h).
  const BatchPlan wide = WidePlan(plan);
  absl::StatusOr<AssemblyProgram> prog = BuildProgramFor(wide, pieces);
  if (!prog.ok()) return prog;
  prog->wide_at = Align(prog->scratch_bytes, kArrayAlignment);
  prog->wide_bytes = wide.total_bytes;
  prog->scratch_bytes = prog->wide_at + wide.total_bytes;
  prog->slot_bytes = plan.total_bytes;
  prog->narrows = NarrowOps(wide, plan);
  prog->narrows_at = prog->staging_bytes;
  prog->staging_bytes = Align(prog->narrows_at + prog->narrows.size() * sizeof(NarrowOp), 16);
  return prog;
}

void PackStaging(const AssemblyProgram& prog, std::byte* staging) {
  if (!prog.host_arrays.empty()) std::memcpy(staging, prog.host_arrays.data(), prog.host_arrays.size());
  for (const HostPack& p : prog.packs) {
    if (p.decode == nullptr) std::memcpy(staging + p.dst, p.src, p.bytes);
    else if (prog.value_bytes == 4) DecodeCompressed(*p.decode, p.window, reinterpret_cast<float*>(staging + p.dst));
    else DecodeCompressed(*p.decode, p.window, reinterpret_cast<double*>(staging + p.dst));
  }
  if (!prog.copies.empty()) std::memcpy(staging + prog.copies_at, prog.copies.data(), prog.copies.size() * sizeof(CopyItem));
  if (!prog.csc_pieces.empty()) {
    std::memcpy(staging + prog.csc_pieces_at, prog.csc_pieces.data(), prog.csc_pieces.size() * sizeof(CscPieceOp));
  }
  if (!prog.scatters.empty()) std::memcpy(staging + prog.scatters_at, prog.scatters.data(), prog.scatters.size() * sizeof(ScatterOp));
  if (!prog.decodes.empty()) std::memcpy(staging + prog.decodes_at, prog.decodes.data(), prog.decodes.size() * sizeof(DecodeOp));
  if (!prog.frames.empty()) std::memcpy(staging + prog.frames_at, prog.frames.data(), prog.frames.size() * sizeof(FramesOp));
  if (!prog.narrows.empty()) std::memcpy(staging + prog.narrows_at, prog.narrows.data(), prog.narrows.size() * sizeof(NarrowOp));
}

}  // namespace conveyor::gpu
