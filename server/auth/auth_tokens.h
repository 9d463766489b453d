#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace jobbroker::server {

// What a bearer token may do. Roles are not hierarchical: admin does not imply producer or
// worker; a token that needs several lists them all.
enum class Role : uint8_t {
  kProducer,  // Enqueue, EnqueueBatch
  kWorker,    // Lease, Work, Heartbeat, Ack, Fail, Release
  kAdmin,     // every Admin RPC
  kPeer,      // the Replication service between cluster nodes, and Admin.WatchJob (dependencies)
};

// "producer", "worker", "admin", "peer".
absl::string_view RoleName(Role role);

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 of `data` (OpenSSL's libcrypto).
Sha256Digest Sha256(absl::string_view data);

// One entry of the --auth-tokens file. Only the token's digest is kept, never the token.
struct TokenEntry {
  // Names the token in refusals and logs (the token itself never appears anywhere).
  std::string name;
  Sha256Digest sha256{};
  std::vector<Role> roles;
  // Queue patterns: an exact queue name, or a prefix followed by one trailing `*` ("billing.*"
  // matches "billing.eu"; "*" matches every queue).
  std::vector<std::string> queues;
};

// Parses the --auth-tokens file's JSON:
//
//   {"tokens": [{"name": "billing-producer", "sha256": "<64 hex digits>",
//                "roles": ["producer"], "queues": ["billing.*", "emails"]}]}
//
// Each entry has `name`, exactly one of `sha256` (hex SHA-256 of the token) and `token` (the
// token in plain text, for development: the file then reveals it), a non-empty `roles` list of
// producer | worker | admin | peer, and a non-empty `queues` list of patterns (which a token
// whose only role is peer, the one cluster nodes present to each other, may leave out: the
// replication service touches no queue by name). kInvalidArgument whose
// message names the entry (`tokens[2] ("billing-producer")`) and the field, for malformed JSON,
// an unknown field, an unknown role, an empty or malformed pattern, bad hex, or a name or token
// that another entry already has. The message never contains a plaintext token.
absl::StatusOr<std::vector<TokenEntry>> ParseAuthTokens(absl::string_view json);

// Reads and parses the file at `path`; errors start with "--auth-tokens PATH: ".
absl::StatusOr<std::vector<TokenEntry>> LoadAuthTokens(const std::string& path);

}  // namespace jobbroker::server
