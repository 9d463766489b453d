#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/flags.h"

namespace grpc {
class ServerCredentials;
}

namespace jobbroker {

// The gRPC listener's credentials from the flags: insecure without --tls-cert; TLS with the
// certificate chain and key; mutual TLS (client certificates required and verified against
// the CA) with --tls-client-ca. kInvalidArgument naming the flag of a file that cannot be
// read or holds no PEM block, so a bad mount is reported at start, not at the first client.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const ServerFlags& flags);

}  // namespace jobbroker
