#include "server/stream_setup.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "proto/subscribe.h"

namespace conveyor {
namespace {

constexpr size_t kMaxName = 256;
constexpr size_t kMaxCursor = 4096;

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
  out.credits = s.initial_credits() == 0 ? o.default_credits : s.initial_credits();
  auto transport = MakeTransport(s, TransportEnv{&o, env.in_flight, out.credits});
  if (!transport.ok()) return transport.status();
  out.transport = std::move(*transport);
  auto ds = env.registry->Find(s.dataset());
  if (!ds.ok()) return ds.status();
  out.dataset = *ds;
  auto request = SubscribeToRequest(s);
  if (!request.ok()) return request.status();
  request->threads = o.parser_threads_per_stream;
  auto resolved = ResolveStream(*out.dataset, *request);
  if (!resolved.ok()) return resolved.status();
  out.resolved = std::move(*resolved);
  out.resolved.loader.pool = env.pool;
  for (const std::string& w : out.resolved.warnings) std::fprintf(stderr, "WARNING: subscription: %s\n", w.c_str());
  const uint64_t pieces = MaxPieces(out.resolved.loader.planner, out.dataset->index());
  const uint64_t per_piece = PieceBookkeepingBytes(out.dataset->streams().size());
  if (static_cast<unsigned __int128>(pieces) * per_piece > o.subscription_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "minibatches of up to ", pieces, " pieces need ", pieces * per_piece,
        " bytes of bookkeeping each, beyond the subscription budget server.subscriptionBytes (", o.subscription_bytes,
        " bytes): ask for smaller minibatches"));
  }
  // Parsing a chunk must fit the daemon's chunk cache (parsed chunks of every dataset, an
  // estimate of this one's parsed size by its bytes in the file).
  const DatasetRegistry* registry = env.registry;
  const Dataset* dataset = out.dataset.get();
  const uint64_t limit = env.chunk_cache_bytes;
  out.resolved.loader.admit_chunk = [registry, dataset, limit](uint64_t chunk) -> absl::Status {
    // A chunk in memory already (kept, or another reader's) costs nothing more.
    if (dataset->HoldsChunk(chunk)) return absl::OkStatus();
    const uint64_t estimate = dataset->ChunkBytes(chunk);
    uint64_t held = registry->ResidentBytes();
    if (held <= limit && estimate <= limit - held) return absl::OkStatus();
    // Chunks kept only for readers to come give way (least recently used first, those of
    // datasets without keepDataInMemory before those with it), if no reader holds them:
    // dropping one a reader holds frees nothing.
    registry->DropUnheld(held + estimate - limit);  // > 0: the room is short by that much
    held = registry->ResidentBytes();
    if (held <= limit && estimate <= limit - held) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "parsing chunk ", chunk, " of '", dataset->config().name, "' (about ", estimate,
        " bytes) would pass the daemon's chunk cache budget server.chunkCacheBytes (", limit, " bytes): ", held,
        " bytes of parsed chunks are held; lower randomizationWindow or raise the budget"));
  };
  auto assembler = out.transport->MakeAssembler();
  if (!assembler.ok()) return assembler.status();
  out.assembler = std::move(*assembler);
  auto loader = Loader::Create(out.dataset.get(), out.assembler.get(), out.resolved.loader);
  if (!loader.ok()) return loader.status();
  out.loader = std::move(*loader);
  return out;
}

}  // namespace conveyor
