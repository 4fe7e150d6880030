#include "server/stream_setup.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "proto/wire.h"
#include "server/shared_memory.h"

namespace conveyor {
namespace {

constexpr size_t kMaxName = 256;
constexpr size_t kMaxCursor = 4096;
constexpr int kMaxLayouts = 1024;

absl::Status CheckTransport(const v1::Subscribe& s, const ServiceOptions& o, StreamSetup* out) {
  switch (s.transport()) {
    case v1::TRANSPORT_INLINE:
      out->transport = StreamTransport::kInline;
      return absl::OkStatus();
    case v1::TRANSPORT_SHARED_MEMORY:
      if (o.fd_server == nullptr) {
        return absl::InvalidArgumentError("shared memory needs the daemon's unix socket (started without one)");
      }
      out->transport = StreamTransport::kSharedMemory;
      return absl::OkStatus();
    case v1::TRANSPORT_CUDA_IPC: {
      std::string why;
      const int devices = CudaDeviceCount(&why);
      if (devices == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "TRANSPORT_CUDA_IPC needs a CUDA device on the daemon's host, and it has none (", why,
            "); subscribe with TRANSPORT_SHARED_MEMORY or TRANSPORT_INLINE"));
      }
      out->cuda_device = s.has_cuda_device() ? s.cuda_device() : o.cuda_device;
      if (out->cuda_device < 0 || out->cuda_device >= devices) {
        return absl::InvalidArgumentError(absl::StrCat("cuda_device ", out->cuda_device, " is not one of the daemon's ",
                                                       devices, " CUDA device(s)"));
      }
      out->transport = StreamTransport::kCudaIpc;
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown transport ", static_cast<int>(s.transport())));
  }
}

absl::StatusOr<StreamRequest> ToRequest(const v1::Subscribe& s, const ServiceOptions& o) {
  StreamRequest r;
  if (s.layouts_size() > kMaxLayouts) return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxLayouts, " layouts"));
  for (const auto& [name, layout] : s.layouts()) {
    auto l = LayoutFromProto(layout);
    if (!l.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(l.status().message(), " for stream '", name.substr(0, 64), "'"));
    }
    r.layouts[name] = *l;
  }
  switch (s.minibatch_mode()) {
    case v1::MINIBATCH_MODE_DEFAULT:
      break;
    case v1::MINIBATCH_MODE_PARTIAL:
      r.full_minibatches = false;
      break;
    case v1::MINIBATCH_MODE_FULL:
      r.full_minibatches = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown minibatch_mode ", static_cast<int>(s.minibatch_mode()),
                                                     " (expected MINIBATCH_MODE_DEFAULT, MINIBATCH_MODE_PARTIAL or "
                                                     "MINIBATCH_MODE_FULL)"));
  }
  if (s.has_randomize()) r.randomize = s.randomize();
  if (s.has_seed()) r.seed = s.seed();
  r.minibatch_size = s.minibatch_size();
  r.epochs = s.epochs() == 0 ? 1 : s.epochs();
  if (s.has_epoch_size()) r.epoch_size = s.epoch_size();
  if (s.has_rank()) r.rank = s.rank();
  if (s.has_world()) r.world = s.world();
  if (s.has_frame_mode()) r.frame_mode = s.frame_mode();
  if (s.parallel() > 0 && s.truncation() == 0) return absl::InvalidArgumentError("parallel needs truncation");
  if (s.truncation() > (1u << 20)) return absl::InvalidArgumentError("truncation must be at most 2^20");
  r.truncation = s.truncation();
  r.parallel = s.parallel();
  r.resume = s.resume_cursor();
  r.threads = o.parser_threads_per_stream;
  switch (s.distribution()) {
    case v1::DISTRIBUTION_DEFAULT:
      break;
    case v1::DISTRIBUTION_BALANCED:
      r.distribution = Distribution::kBalanced;
      break;
    case v1::DISTRIBUTION_CHUNKS:
      r.distribution = Distribution::kChunks;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown distribution ", static_cast<int>(s.distribution())));
  }
  if (s.has_first_epoch()) r.first_epoch = s.first_epoch();
  r.batch_stride = std::max<uint32_t>(1, s.batch_stride());
  r.batch_offset = s.batch_offset();
  if (s.dtypes_size() > kMaxLayouts) return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxLayouts, " dtypes"));
  for (const auto& [name, dtype] : s.dtypes()) {
    if (dtype == v1::DTYPE_FLOAT16) {
      r.value_dtypes[name] = DType::kFloat16;
    } else if (dtype == v1::DTYPE_BFLOAT16) {
      r.value_dtypes[name] = DType::kBFloat16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("dtypes['", name.substr(0, 64),
                                                     "']: a stream's values may be asked as DTYPE_FLOAT16 or "
                                                     "DTYPE_BFLOAT16 only"));
    }
  }
  return r;
}

// The most pieces one minibatch of this stream can have: a piece holds at least one sample
// (one step in BPTT), and a minibatch holds at most minibatch_size samples (T x N steps)
// and, in full mode, the units of at most two sweeps.
uint64_t MaxPieces(const PlannerOptions& p, const Index& index) {
  if (p.truncation > 0) {
    const uint64_t slots = p.parallel > 0 ? p.parallel : std::max<uint64_t>(1, p.minibatch_size / p.truncation);
    return uint64_t{p.truncation} * slots;
  }
  const uint64_t units = p.randomizer.frame_mode ? index.total_samples : index.sequences.size();
  return std::min<uint64_t>(p.minibatch_size, 2 * units);
}

}  // namespace

absl::StatusOr<StreamSetup> SetUpStream(const v1::Subscribe& s, const SetupEnv& env) {
  const ServiceOptions& o = *env.options;
  if (s.dataset().size() > kMaxName) return absl::InvalidArgumentError("dataset name longer than 256 bytes");
  if (s.resume_cursor().size() > kMaxCursor) return absl::InvalidArgumentError("resume cursor longer than 4096 bytes");
  if (s.initial_credits() > o.max_credits) {
    return absl::InvalidArgumentError(absl::StrCat("initial_credits must be at most ", o.max_credits));
  }
  StreamSetup out;
  absl::Status st = CheckTransport(s, o, &out);
  if (!st.ok()) return st;
  auto ds = env.registry->Find(s.dataset());
  if (!ds.ok()) return ds.status();
  out.dataset = *ds;
  auto request = ToRequest(s, o);
  if (!request.ok()) return request.status();
  auto resolved = ResolveStream(*out.dataset, *request);
  if (!resolved.ok()) return resolved.status();
  out.resolved = std::move(*resolved);
  out.resolved.loader.pool = env.pool;
  for (const std::string& w : out.resolved.warnings) std::fprintf(stderr, "WARNING: subscription: %s\n", w.c_str());
  const uint64_t pieces = MaxPieces(out.resolved.loader.planner, out.dataset->index());
  if (static_cast<unsigned __int128>(pieces) * kPieceBookkeepingBytes > o.subscription_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "minibatches of up to ", pieces, " pieces need ", pieces * kPieceBookkeepingBytes,
        " bytes of bookkeeping each, beyond the subscription budget server.subscriptionBytes (", o.subscription_bytes,
        " bytes): ask for smaller minibatches"));
  }
  // Parsing a chunk must fit the daemon's chunk cache (parsed chunks of every dataset, an
  // estimate of this one's parsed size by its bytes in the file).
  const DatasetRegistry* registry = env.registry;
  const Dataset* dataset = out.dataset.get();
  const uint64_t limit = env.chunk_cache_bytes;
  out.resolved.loader.admit_chunk = [registry, dataset, limit](uint64_t chunk) -> absl::Status {
    const uint64_t held = registry->ResidentBytes();
    const uint64_t estimate = dataset->ChunkBytes(chunk);
    if (held <= limit && estimate <= limit - held) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "parsing chunk ", chunk, " of '", dataset->config().name, "' (about ", estimate,
        " bytes) would pass the daemon's chunk cache budget server.chunkCacheBytes (", limit, " bytes): ", held,
        " bytes of parsed chunks are held; lower randomizationWindow or raise the budget"));
  };
  std::string note;
  if (out.transport == StreamTransport::kCudaIpc) {  // assembled where it travels from: device memory
    auto cuda = MakeCudaAssembler(out.cuda_device, o.staging_bytes);
    if (!cuda.ok()) return cuda.status();
    out.assembler = std::move(*cuda);
  } else {
    // The CUDA assembler overlaps by itself (the device assembles batch k while the host
    // plans k+1). The CPU one stays synchronous: on a worker thread of its own it cost CPU
    // time and gained no throughput here (bench/RESULTS.md, "Pipelined assembly").
    out.assembler = SelectAssembler(o.cuda_assembler, o.cuda_device, &note, o.staging_bytes);
    if (o.pipelined_cpu_assembly && !out.assembler->pipelined()) {
      out.assembler = MakePipelinedAssembler(std::move(out.assembler));
    }
  }
  auto loader = Loader::Create(out.dataset.get(), out.assembler.get(), out.resolved.loader);
  if (!loader.ok()) return loader.status();
  out.loader = std::move(*loader);
  out.credits = s.initial_credits() == 0 ? o.default_credits : s.initial_credits();
  return out;
}

}  // namespace conveyor
