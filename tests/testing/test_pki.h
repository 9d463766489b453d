#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {

// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made with the
// openssl command line (EC keys: quick to generate), for the TLS tests. Paths are inside the
// directory given to MakePki; the *_pem fields hold the files' text for gRPC's options.
struct TestPki {
  std::string ca_cert, server_cert, server_key, client_cert, client_key;
  std::string ca_pem, client_cert_pem, client_key_pem;
};

absl::StatusOr<TestPki> MakePki(const TempDir& dir);

// The whole text of a file.
absl::StatusOr<std::string> ReadText(const std::string& path);

}  // namespace jobbroker::testing
