#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace jobbroker::server {

// absl and gRPC share the canonical codes, so the mapping is a cast; the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace jobbroker::server
