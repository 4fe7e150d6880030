// loader_service.h: conveyor.v1.Loader on gRPC's callback API. Unary calls answer from the
// registry; each Stream call gets a StreamReactor that owns its subscription: a Loader
// (planner, parser threads, assembler) run by one producer thread that stops whenever the
// subscriber has no credit, so a slow subscriber never grows the daemon's memory and never
// slows the others. Reactions never block: they only move messages between a bounded queue
// and the one write in flight.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <vector>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/batch/assembler.h"
#include "common/sampling/loader.h"
#include "common/sampling/stream_request.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "server/dataset_registry.h"
#include "server/metrics.h"
#include "server/shared_memory.h"

namespace conveyor {

struct ServiceOptions {
  uint64_t inline_part_bytes = 1u << 20;  // bytes of a batch per message
  uint32_t default_credits = 4;
  uint32_t max_credits = 64;
  int parser_threads = 0;             // the daemon's parser pool, shared by all subscriptions; 0: cores
  int parser_threads_per_stream = 2;  // chunks one subscription parses at once (from the pool)
  size_t max_subscriptions = 256;
  FdServer* fd_server = nullptr;  // enables TRANSPORT_SHARED_MEMORY; not owned
  uint64_t min_slot_bytes = 1u << 20;  // shared memory: smallest slot
  double slot_headroom = 2.0;          // shared memory: a new segment's slots fit this x the batch
  Metrics* metrics = nullptr;          // not owned; optional
  std::string token;                   // non-empty: TCP calls need "authorization: Bearer <token>"
  bool cuda_assembler = false;         // assemble on the GPU (falls back to the CPU, logged once)
  int cuda_device = 0;
  uint64_t staging_bytes = 0;  // the CUDA assembler's pinned staging buffers (0: its default)
  // The CPU assembler on a worker thread per stream, two batches in flight as with CUDA. Off:
  // it gained nothing on the machines measured (bench/RESULTS.md); tests run the daemon's
  // pipelined path with it, which CUDA streams take on a GPU host.
  bool pipelined_cpu_assembly = false;
};

class LoaderService;

class StreamReactor final : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  explicit StreamReactor(LoaderService* service);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // The daemon drains: finish the batch being made, flush, then end with UNAVAILABLE and
  // the last cursor.
  void Drain();
  // Finishes right away with `status` (used before any subscription exists).
  void Refuse(const grpc::Status& status);

 private:
  absl::Status Subscribe(const v1::Subscribe& s);
  void Produce();
  struct BegunBatch;
  // Queues batch `b`'s messages (descriptor, and its payload inline); false if the stream
  // was cancelled meanwhile. mu_ not held.
  bool Publish(const Batch& batch, BegunBatch* b);
  void Enqueue(std::vector<v1::StreamResponse> messages);
  // Starts the next write, or finishes when everything is sent. mu_ held.
  void Pump();
  void FinishLocked(const grpc::Status& status);

  LoaderService* const service_;
  v1::StreamRequest request_;
  v1::StreamResponse current_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::StreamResponse> queue_;
  bool subscribed_ = false;
  bool writing_ = false;
  bool finish_called_ = false;
  bool producer_done_ = false;
  bool stop_ = false;      // no more batches (cancel, error, drain)
  bool draining_ = false;
  uint32_t credits_ = 0;
  std::set<uint64_t> outstanding_;
  uint64_t next_serial_ = 0;
  std::string last_cursor_;
  grpc::Status final_status_;
  std::shared_ptr<const Dataset> dataset_;
  ResolvedStream resolved_;
  std::unique_ptr<BatchAssembler> assembler_;
  std::unique_ptr<Loader> loader_;
  std::thread producer_;
  double parse_seconds_reported_ = 0;
  // Shared-memory transport: segments of equal slots; a batch takes a free slot of the
  // newest segment and its ack gives the slot back.
  // CUDA IPC: the same, in blocks of device memory exported with cudaIpcGetMemHandle.
  struct Segment {
    uint32_t id;
    std::shared_ptr<ShmSegment> shm;
    std::shared_ptr<void> device;  // CUDA IPC: the block (freed with the stream)
    uint64_t slot_bytes;
    std::vector<uint32_t> free_slots;
    std::string token;
  };
  bool shm_ = false;
  bool cuda_ipc_ = false;
  int cuda_device_ = 0;
  uint32_t slots_per_segment_ = 0;
  std::vector<Segment> segments_;
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> slot_of_serial_;  // serial -> (segment, slot)
  struct SlotRef {
    uint32_t segment = 0;
    uint64_t offset = 0;
    std::byte* data = nullptr;
  };
  struct BegunBatch {  // begun by the loader, not yet published
    uint64_t serial = 0;
    std::vector<v1::StreamResponse> messages;  // a new segment's announcement goes first
    std::string payload;                       // inline: the batch's bytes
    SlotRef slot;                              // shm, CUDA IPC: where it is assembled
  };
  // Takes a free slot of at least `bytes` for batch `serial` (announcing a new segment in
  // `messages` if needed). mu_ not held.
  absl::StatusOr<SlotRef> ReserveSlot(uint64_t serial, uint64_t bytes, std::vector<v1::StreamResponse>* messages);
};

class LoaderService final : public v1::Loader::CallbackService {
 public:
  LoaderService(std::unique_ptr<DatasetRegistry> registry, ServiceOptions options);

  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* ctx, const v1::ListDatasetsRequest* req,
                                         v1::ListDatasetsResponse* resp) override;
  grpc::ServerUnaryReactor* DescribeDataset(grpc::CallbackServerContext* ctx, const v1::DescribeDatasetRequest* req,
                                            v1::DatasetDescription* resp) override;
  grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* Stream(grpc::CallbackServerContext* ctx) override;

  // Stops new subscriptions and drains the open ones.
  void Drain();
  size_t active_streams() const;

 private:
  friend class StreamReactor;
  void Unregister(StreamReactor* r);
  // OK for unix-socket peers and for TCP calls with the right bearer token.
  grpc::Status Authorize(grpc::CallbackServerContext* ctx) const;

  const std::unique_ptr<DatasetRegistry> registry_;
  const ServiceOptions options_;
  const std::unique_ptr<ParserPool> pool_;
  mutable std::mutex mu_;
  std::set<StreamReactor*> streams_;
  bool draining_ = false;
};

}  // namespace conveyor
