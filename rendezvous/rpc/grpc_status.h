// Status conversions between Abseil (the module APIs) and gRPC (the wire): the codes are the
// same numbers in both. (A Deadline as gRPC's wall-clock deadline: toSystem, common/deadline.h.)
#pragma once

#include <chrono>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "common/deadline.h"

namespace muster::rendezvous {

inline grpc::Status toGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK
                : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status toAbsl(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace muster::rendezvous
