// The transports the daemon offers, by the Subscribe's `transport`: a new kind is a file of
// its own and one line here.
#include <iterator>

#include "absl/strings/str_cat.h"
#include "server/transports/cuda_ipc_transport.h"
#include "server/transports/inline_transport.h"
#include "server/transports/shm_transport.h"
#include "server/transports/transport.h"

namespace conveyor {
namespace {

absl::StatusOr<std::unique_ptr<Transport>> MakeInline(const v1::Subscribe&,
                                                      const TransportEnv& env) {
  return std::unique_ptr<Transport>(new InlineTransport(env));
}

struct Registration {
  v1::Transport kind;
  absl::StatusOr<std::unique_ptr<Transport>> (*make)(const v1::Subscribe&, const TransportEnv&);
};

constexpr Registration kTransports[] = {
    {v1::TRANSPORT_INLINE, &MakeInline},
    {v1::TRANSPORT_SHARED_MEMORY, &ShmTransport::Create},
    {v1::TRANSPORT_CUDA_IPC, &CudaIpcTransport::Create},
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const v1::Subscribe& subscribe,
                                                         const TransportEnv& env) {
  for (const Registration& r : kTransports) {
    if (r.kind == subscribe.transport()) return r.make(subscribe, env);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport ", static_cast<int>(subscribe.transport())));
}

}  // namespace conveyor
