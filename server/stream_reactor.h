// stream_reactor.h: one Stream call of conveyor.v1.Loader on gRPC's callback API. The
// reactor owns its subscription: a producer thread of its own sets the stream up (checks the
// Subscribe, resolves the cursor, makes the loader) and then runs the loader while the
// subscriber has credit; reactions only move messages between a bounded queue and the one
// write in flight, and never wait for the producer. Cancelling, a client going away or a
// drain cancel the loader (a producer waiting for a chunk returns at once); the reactor is
// deleted by whichever of OnDone() and the producer's exit comes last, so no gRPC thread
// ever waits for a producer.
//
// The reactor holds the stream's flow control and nothing else: credits, the queue of
// messages, the one write in flight, draining and cancelling. Where a batch is assembled,
// what is announced before it and what an acknowledgement frees are its Transport's
// (server/transports/transport.h), whichever kind the subscription asked for.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/sampling/loader.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "server/stream_setup.h"
#include "server/transports/transport.h"

namespace conveyor {

class LoaderService;

// Raw bytes both ways (the method is registered raw, LoaderService): requests are parsed
// here, and responses written as OutgoingMessage::Encode() makes them, an inline batch's
// bytes sent from its buffer, never copied into a protobuf message.
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `service` must outlive the reactor (LoaderService waits for every reactor it made).
  explicit StreamReactor(LoaderService* service);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // The daemon drains: send the batches begun, then end with UNAVAILABLE and the last cursor.
  void Drain();
  // Finishes right away with `status` (before any subscription exists).
  void Refuse(const grpc::Status& status);
  // Ends the call with DEADLINE_EXCEEDED when it has not subscribed by `deadline` (its first
  // message is late); true if it did.
  bool ExpireUnsubscribed(std::chrono::steady_clock::time_point deadline_for_start,
                          std::chrono::milliseconds timeout);
  // Finishes a stream whose end was sent and whose client has not closed its side within
  // the service's end_grace_ms (every batch acknowledged) or end_idle_ms (some not), counted
  // from the end or the last acknowledgement; true if it did.
  bool ExpireEnded(std::chrono::steady_clock::time_point now);

 private:
  // The producer thread: setup, then Produce(), then its share of the teardown.
  void Run();
  void Produce();
  // Queues the messages of `batch`, assembled at `destination`; false if the stream was
  // cancelled meanwhile.
  bool Publish(const Batch& batch, std::unique_ptr<Transport::Destination> destination);
  // Stops the producer (mu_ held): no more batches; a wait for a chunk ends.
  void StopLocked();
  // Starts the next write, or finishes when everything is sent (mu_ held).
  void Pump();
  void FinishLocked(const grpc::Status& status);
  // The last of OnDone() and the producer's exit: releases everything and deletes this.
  void Destroy();

  LoaderService* const service_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  grpc::ByteBuffer request_bytes_;  // the read in flight
  v1::StreamRequest request_;       // ... parsed
  grpc::ByteBuffer current_;        // the write in flight
  // The batch whose part is being written (its buffer and budget), until the write is done.
  std::shared_ptr<const std::byte> current_payload_;
  // Locking: std::mutex rather than absl::Mutex because the last user deletes the reactor
  // right after unlocking it, which POSIX mutexes allow.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OutgoingMessage> queue_;
  v1::Subscribe subscribe_;
  bool subscribed_ = false;
  bool producer_running_ = false;
  bool producer_done_ = false;    // no more messages will be queued
  bool producer_exited_ = false;  // the producer thread touches nothing any more
  bool done_ = false;             // OnDone() was called
  bool writing_ = false;
  bool finish_called_ = false;
  bool stop_ = false;  // no more batches (cancel, error, drain)
  bool draining_ = false;
  bool end_queued_ = false;     // the end-of-stream message is queued (or sent)
  bool client_closed_ = false;  // the client closed its side (after reading the end)
  // When everything up to the end was written, and the last acknowledgement (ExpireEnded).
  std::chrono::steady_clock::time_point ended_at_{}, last_ack_at_{};
  uint32_t credits_ = 0;
  // Batches published whose messages are not all written yet, and at most how many may be:
  // an ack gives a credit back, but a client that acks batches it has not read (they wait
  // behind HTTP/2 flow control) must not make the daemon queue more and more of them; the
  // producer waits for both.
  uint32_t unsent_ = 0;
  uint32_t max_unsent_ = 1;
  bool current_ends_batch_ = false;  // the write in flight is a batch's last message
  std::set<uint64_t> outstanding_;
  uint64_t next_serial_ = 0;
  std::string last_cursor_;
  grpc::Status final_status_;
  // Set up by the producer (under mu_), read by it without the lock.
  std::shared_ptr<const Dataset> dataset_;
  ResolvedStream resolved_;
  std::unique_ptr<BatchAssembler> assembler_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Transport> transport_;  // set under mu_; acks release through it
  double parse_seconds_reported_ = 0;
};

}  // namespace conveyor
