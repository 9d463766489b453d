#include "server/grpc/rpc_auth.h"

#include <grpcpp/server_context.h>

#include <vector>

namespace jobbroker::server {

std::vector<absl::string_view> AuthorizationOf(const grpc::ServerContextBase& ctx) {
  std::vector<absl::string_view> values;
  auto [begin, end] = ctx.client_metadata().equal_range("authorization");
  for (auto it = begin; it != end; ++it) values.emplace_back(it->second.data(), it->second.size());
  return values;
}

absl::StatusOr<const TokenEntry*> RpcAuth::Caller(const grpc::ServerContextBase& ctx) const {
  if (authorizer_ == nullptr) return nullptr;
  return authorizer_->Authenticate(AuthorizationOf(ctx));
}

absl::Status RpcAuth::Check(const grpc::ServerContextBase& ctx, Role role) const {
  absl::StatusOr<const TokenEntry*> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return *caller == nullptr ? absl::OkStatus() : Authorizer::AllowRole(**caller, role);
}

absl::Status RpcAuth::Check(const grpc::ServerContextBase& ctx, Role role,
                            absl::string_view queue) const {
  absl::StatusOr<const TokenEntry*> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return Allow(*caller, role, queue);
}

absl::Status RpcAuth::CheckJob(const grpc::ServerContextBase& ctx, Role role,
                               const std::string& job_id) const {
  absl::StatusOr<const TokenEntry*> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return AllowJob(*caller, role, job_id);
}

absl::Status RpcAuth::Allow(const TokenEntry* caller, Role role, absl::string_view queue) const {
  if (caller == nullptr) return absl::OkStatus();
  return Authorizer::Allow(*caller, role, queue);
}

absl::Status RpcAuth::AllowJob(const TokenEntry* caller, Role role,
                               const std::string& job_id) const {
  if (caller == nullptr) return absl::OkStatus();
  // The role first: a caller without it learns nothing about which jobs exist.
  if (absl::Status s = Authorizer::AllowRole(*caller, role); !s.ok()) return s;
  absl::StatusOr<std::string> queue = broker_.JobQueue(job_id);
  if (!queue.ok()) return absl::OkStatus();  // the call answers NOT_FOUND / INVALID_ARGUMENT
  return Authorizer::Allow(*caller, role, *queue);
}

}  // namespace jobbroker::server
