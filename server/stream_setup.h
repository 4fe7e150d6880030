// stream_setup.h: a Subscribe message checked and turned into what its stream needs: the
// dataset, the resolved stream (planner options, cursor identity), its transport, an
// assembler for the transport's memory and a loader. Every field is bounded here (sizes,
// enums, credits) and the subscription's memory budget is checked against the worst
// minibatch the request allows, so that nothing a client asks for makes the daemon plan or
// allocate without limit. Runs on the subscription's producer thread, never on a gRPC
// thread (resolving a cursor seeks the randomizer: O(window)).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/batch/assembler.h"
#include "common/sampling/loader.h"
#include "common/sampling/parser_pool.h"
#include "common/sampling/stream_request.h"
#include "conveyor/v1/conveyor.pb.h"
#include "server/dataset_registry.h"
#include "server/memory_budget.h"
#include "server/service_options.h"
#include "server/transports/transport.h"

namespace conveyor {

// Bytes of bookkeeping a minibatch's piece costs the daemon besides the batch's bytes (the
// planner's piece, the chunk reference, the placed piece, its descriptor entries), and more
// for each stream of the dataset (the piece's samples of it, and where its entries lie when
// any stream is sparse: BatchPlan::counts and ::entries): bounded by the subscription's
// budget up front.
inline constexpr uint64_t kPieceBookkeepingBytes = 256;
inline constexpr uint64_t kPieceStreamBookkeepingBytes = 40;
inline uint64_t PieceBookkeepingBytes(size_t streams) {
  return kPieceBookkeepingBytes + kPieceStreamBookkeepingBytes * streams;
}

struct StreamSetup {
  std::shared_ptr<const Dataset> dataset;
  ResolvedStream resolved;
  std::unique_ptr<BatchAssembler> assembler;
  std::unique_ptr<Loader> loader;
  std::unique_ptr<Transport> transport;
  uint32_t credits = 0;
};

struct SetupEnv {
  const DatasetRegistry* registry = nullptr;
  const ServiceOptions* options = nullptr;
  ParserPool* pool = nullptr;
  MemoryBudget* in_flight = nullptr;  // the daemon's budget for batches in flight
  uint64_t chunk_cache_bytes = 0;     // parsed chunks of every dataset together
};

// Errors (the message says which field and what was expected): InvalidArgument (a field out
// of range, an unknown enum value, a layout that does not apply, a bad cursor, shared memory
// without the unix socket), NotFound (dataset), FailedPrecondition (CUDA IPC without a
// device), ResourceExhausted (a minibatch's bookkeeping beyond the subscription's budget).
absl::StatusOr<StreamSetup> SetUpStream(const v1::Subscribe& s, const SetupEnv& env);

}  // namespace conveyor
