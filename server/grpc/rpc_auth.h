#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "node/partitions.h"
#include "server/auth/authorizer.h"

namespace grpc {
class ServerContextBase;
}

namespace jobbroker::server {

// The values of the caller's `authorization` metadata, as sent (none, one, or several), viewing
// `ctx`'s metadata. The one reader of the token: the check below and the calls a node forwards
// for its caller (Forwarder) both take it from here.
std::vector<absl::string_view> AuthorizationOf(const grpc::ServerContextBase& ctx);

// The one check the gRPC services call: who is calling (the `authorization` metadata) and may
// they do this to that queue. With no Authorizer (no --auth-tokens) every check passes and the
// caller is nullptr. Thread-safe; `authorizer` and `broker` are borrowed and must outlive it.
class RpcAuth {
 public:
  RpcAuth(const Authorizer* authorizer, node::Partitions& broker)
      : authorizer_(authorizer), broker_(broker) {}

  bool enabled() const { return authorizer_ != nullptr; }

  // The caller's token entry; nullptr when auth is off. kUnauthenticated (Authorizer).
  absl::StatusOr<const TokenEntry*> Caller(const grpc::ServerContextBase& ctx) const;

  // The caller may use `role` (on `queue`). kUnauthenticated or kPermissionDenied.
  absl::Status Check(const grpc::ServerContextBase& ctx, Role role) const;
  absl::Status Check(const grpc::ServerContextBase& ctx, Role role, absl::string_view queue) const;
  // The same on the queue of job `job_id`, looked up in the broker. A job that cannot be found
  // passes (after the role check): the call itself then answers NOT_FOUND, and a job's queue
  // never changes, so the lookup cannot race with the call.
  absl::Status CheckJob(const grpc::ServerContextBase& ctx, Role role,
                        const std::string& job_id) const;

  // The same for a caller already authenticated (a stream's, once at its start).
  absl::Status Allow(const TokenEntry* caller, Role role, absl::string_view queue) const;
  absl::Status AllowJob(const TokenEntry* caller, Role role, const std::string& job_id) const;

 private:
  const Authorizer* const authorizer_;
  node::Partitions& broker_;
};

}  // namespace jobbroker::server
