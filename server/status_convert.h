// status_convert.h: absl::Status -> grpc::Status, in one place at the service edge.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace conveyor {

grpc::Status ToGrpc(const absl::Status& status);

}  // namespace conveyor
