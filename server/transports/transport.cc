#include "server/transports/transport.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"

namespace conveyor {

void OutgoingMessage::Materialize() {
  if (payload == nullptr) return;
  v1::InlinePayload* p = message.has_batch() ? message.mutable_batch()->mutable_payload()
                                             : message.mutable_more()->mutable_payload();
  p->set_data(reinterpret_cast<const char*>(payload.get()) + offset, size);
}

absl::StatusOr<std::unique_ptr<BatchAssembler>> Transport::MakeAssembler() const {
  // The CUDA assembler overlaps by itself (the device assembles batch k while the host
  // plans k+1). The CPU one stays synchronous: on a worker thread of its own it cost CPU
  // time and gained no throughput here (bench/RESULTS.md, "Pipelined assembly").
  std::string note;
  std::unique_ptr<BatchAssembler> assembler =
      SelectAssembler(options_.cuda_assembler, options_.cuda_device, &note, options_.staging_bytes);
  if (options_.pipelined_cpu_assembly && !assembler->pipelined()) {
    assembler = MakePipelinedAssembler(std::move(assembler));
  }
  return assembler;
}

absl::StatusOr<std::unique_ptr<Transport::Destination>> Transport::Reserve(uint64_t serial,
                                                                           uint64_t bytes) {
  if (static_cast<unsigned __int128>(bytes) * credits_ > options_.subscription_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch ", serial, " of ", bytes, " bytes x ", credits_,
                     " credits exceeds the subscription budget server.subscriptionBytes (",
                     options_.subscription_bytes,
                     " bytes): ask for fewer credits or smaller batches (a sparse stream as CSC or "
                     "CSR rather than dense)"));
  }
  return ReserveChecked(serial, bytes);
}

}  // namespace conveyor
