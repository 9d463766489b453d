#pragma once

#include "absl/status/status.h"
#include "client/cpp/cli/args.h"
#include "jobbroker/client.h"

namespace jobbroker::cli {

// Fills `options`' TLS and bearer token from the global flags --tls, --tls-ca, --tls-cert,
// --tls-key, --tls-server-name and --token-file, and $JOBBROKER_TOKEN when --token-file is not
// given. The token is read from a file or the environment, never from the command line, where
// every user of the machine could read it (ps, /proc). INVALID_ARGUMENT naming the flag for a file
// that cannot be read, an empty token, or --tls-cert without --tls-key; the message never holds
// the token.
absl::Status ApplyConnectionFlags(const ParsedArgs& args, client::ClientOptions& options);

}  // namespace jobbroker::cli
