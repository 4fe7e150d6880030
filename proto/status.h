// status.h: absl::Status <-> grpc::Status, one function each way, used at the edges: the
// daemon's service answers with ToGrpc(), the C++ client reads calls with FromGrpc(). Both
// keep the code (absl and gRPC share the canonical numbering) and the message unchanged.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace conveyor {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace conveyor
