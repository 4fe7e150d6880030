#include "server/status_convert.h"

namespace conveyor {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), std::string(s.message()));
}

}  // namespace conveyor
