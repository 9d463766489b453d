#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth/auth_tokens.h"

namespace jobbroker::server {

// True if `pattern` (see TokenEntry::queues) matches `queue`: equal, or `pattern` ends in `*`
// and `queue` starts with what comes before it.
bool QueuePatternMatches(absl::string_view pattern, absl::string_view queue);

// Decides who is calling and what they may do, from the --auth-tokens table. No gRPC here: the
// services hand it the `authorization` metadata and the queue a call touches. Immutable after
// construction, so thread-safe. Messages never contain a token, only its entry's name.
class Authorizer {
 public:
  explicit Authorizer(std::vector<TokenEntry> tokens) : tokens_(std::move(tokens)) {}

  // The entry of the bearer token in `authorization` values (the metadata's, "Bearer <token>";
  // the scheme's case does not matter). kUnauthenticated, with a message starting
  // "authorization", for no value, several values, another scheme, or an unknown token. The
  // presented token is hashed and compared with every entry's digest in constant time, so
  // neither the answer's timing nor the message tells how close a guess came.
  absl::StatusOr<const TokenEntry*> Authenticate(
      const std::vector<absl::string_view>& authorization) const;

  // OK if `token` has `role`; kPermissionDenied naming the token and the role otherwise.
  static absl::Status AllowRole(const TokenEntry& token, Role role);
  // OK if `token` has `role` and one of its patterns matches `queue`; kPermissionDenied naming
  // the token, the role and the queue otherwise.
  static absl::Status Allow(const TokenEntry& token, Role role, absl::string_view queue);
  // Whether one of `token`'s patterns matches `queue` (ListQueues shows only those).
  static bool MatchesQueue(const TokenEntry& token, absl::string_view queue);

 private:
  const std::vector<TokenEntry> tokens_;
};

}  // namespace jobbroker::server
