#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ServerCredentials;
}

namespace jobbroker::server {

// The gRPC listener's TLS files (--tls-cert, --tls-key, --tls-client-ca), PEM.
struct GrpcTlsFiles {
  std::string cert;       // certificate chain; empty: no TLS
  std::string key;        // its private key
  std::string client_ca;  // set: clients must present a certificate this CA signed (mTLS)
};

// The gRPC listener's credentials: insecure without a cert; TLS with the certificate chain and
// key; mutual TLS (client certificates required and verified against the CA) with client_ca.
// kInvalidArgument naming the flag of a file that cannot be read or holds no PEM block, so a
// bad mount is reported at start, not at the first client.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const GrpcTlsFiles& files);

}  // namespace jobbroker::server
