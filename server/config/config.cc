#include "server/config/config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "jobbroker/v1/policy.pb.h"
#include "server/convert/convert.h"

namespace jobbroker::server {

absl::StatusOr<ServerPolicies> ParseServerConfig(const std::string& json) {
  v1::ServerConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &config, options);
  if (!parsed.ok())
    return absl::InvalidArgumentError(absl::StrCat("config: ", parsed.message().as_string()));
  ServerPolicies out;
  absl::StatusOr<core::PolicyOverride> d = FromProto(config.default_policy(), "default_policy");
  if (!d.ok()) return d.status();
  out.default_policy = *d;
  for (const auto& [name, policy] : config.queues()) {
    absl::StatusOr<core::PolicyOverride> q =
        FromProto(policy, absl::StrCat("queues[\"", name, "\"]"));
    if (!q.ok()) return q.status();
    out.queues[name] = *q;
  }
  return out;
}

absl::StatusOr<ServerPolicies> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ServerPolicies> p = ParseServerConfig(text.str());
  if (!p.ok())
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  return p;
}

}  // namespace jobbroker::server
