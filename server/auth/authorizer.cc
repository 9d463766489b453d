#include "server/auth/authorizer.h"

#include <openssl/crypto.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::server {
namespace {

constexpr absl::string_view kScheme = "bearer ";

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(absl::StrCat("authorization: ", why));
}

}  // namespace

bool QueuePatternMatches(absl::string_view pattern, absl::string_view queue) {
  if (!pattern.empty() && pattern.back() == '*') {
    pattern.remove_suffix(1);
    return absl::StartsWith(queue, pattern);
  }
  return pattern == queue;
}

absl::StatusOr<const TokenEntry*> Authorizer::Authenticate(
    const std::vector<absl::string_view>& authorization) const {
  if (authorization.empty())
    return Unauthenticated("missing: send the metadata `authorization: Bearer <token>`");
  if (authorization.size() > 1) return Unauthenticated("give one value, not several");
  absl::string_view value = authorization.front();
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme))
    return Unauthenticated("must be `Bearer <token>`");
  absl::string_view token = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  if (token.empty()) return Unauthenticated("the bearer token is empty");

  // Every entry is compared, match or not, so the time taken does not depend on which entry
  // matched (or how many bytes of a digest did).
  const Sha256Digest digest = Sha256(token);
  const TokenEntry* found = nullptr;
  for (const TokenEntry& entry : tokens_) {
    const bool equal = CRYPTO_memcmp(entry.sha256.data(), digest.data(), digest.size()) == 0;
    if (equal) found = &entry;
  }
  if (found == nullptr) return Unauthenticated("unknown bearer token");
  return found;
}

absl::Status Authorizer::AllowRole(const TokenEntry& token, Role role) {
  if (std::find(token.roles.begin(), token.roles.end(), role) != token.roles.end())
    return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("authorization: token \"", token.name,
                                                  "\" lacks the role ", RoleName(role),
                                                  " that this call needs"));
}

absl::Status Authorizer::Allow(const TokenEntry& token, Role role, absl::string_view queue) {
  if (std::find(token.roles.begin(), token.roles.end(), role) == token.roles.end())
    return absl::PermissionDeniedError(absl::StrCat("authorization: token \"", token.name,
                                                    "\" lacks the role ", RoleName(role),
                                                    " needed on queue \"", queue, "\""));
  if (!MatchesQueue(token, queue))
    return absl::PermissionDeniedError(
        absl::StrCat("authorization: token \"", token.name, "\" has the role ", RoleName(role),
                     " but not on queue \"", queue, "\" (none of its queue patterns matches)"));
  return absl::OkStatus();
}

bool Authorizer::MatchesQueue(const TokenEntry& token, absl::string_view queue) {
  return std::any_of(token.queues.begin(), token.queues.end(),
                     [queue](const std::string& p) { return QueuePatternMatches(p, queue); });
}

}  // namespace jobbroker::server
