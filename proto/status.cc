#include "proto/status.h"

#include <string>

namespace conveyor {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

}  // namespace conveyor
