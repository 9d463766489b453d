#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/policy.h"

namespace jobbroker::server {

// The policies of a --config file (proto3 JSON of jobbroker.v1.ServerConfig).
struct ServerPolicies {
  core::PolicyOverride default_policy;
  std::map<std::string, core::PolicyOverride> queues;
};

// Parses `json`. kInvalidArgument naming the bad field: unknown fields, wrong types, unknown
// enum names and malformed durations are refused, not ignored, so a typo cannot silently fall
// back to a default. (Ranges are checked when the broker opens.)
absl::StatusOr<ServerPolicies> ParseServerConfig(const std::string& json);

// Reads and parses the file at `path`; kNotFound if it cannot be read.
absl::StatusOr<ServerPolicies> LoadServerConfig(const std::string& path);

}  // namespace jobbroker::server
