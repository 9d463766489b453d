#include "server/auth/auth_tokens.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <openssl/sha.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/validation.h"

namespace jobbroker::server {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr Role kRoles[] = {Role::kProducer, Role::kWorker, Role::kAdmin, Role::kPeer};

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// `tokens[2] ("billing-producer")`, or `tokens[2]` before the name is known.
std::string EntryName(int index, absl::string_view name) {
  if (name.empty()) return absl::StrCat("tokens[", index, "]");
  return absl::StrCat("tokens[", index, "] (\"", name, "\")");
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(static_cast<unsigned char>(c));
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

bool ParseHexDigest(absl::string_view hex, Sha256Digest* out) {
  if (hex.size() != 2 * out->size()) return false;
  for (size_t i = 0; i < out->size(); ++i) {
    int hi = HexDigit(hex[2 * i]);
    int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// A list of non-empty strings, at least one.
absl::StatusOr<std::vector<std::string>> Strings(const Struct& entry, absl::string_view field,
                                                 absl::string_view where) {
  auto it = entry.fields().find(std::string(field));
  if (it == entry.fields().end())
    return Invalid(where, absl::StrCat(field, " is required (a list of strings)"));
  if (!it->second.has_list_value())
    return Invalid(where, absl::StrCat(field, " must be a list of strings"));
  const ListValue& list = it->second.list_value();
  if (list.values_size() == 0) return Invalid(where, absl::StrCat(field, " must not be empty"));
  std::vector<std::string> out;
  for (int i = 0; i < list.values_size(); ++i) {
    const Value& v = list.values(i);
    if (v.kind_case() != Value::kStringValue)
      return Invalid(where, absl::StrCat(field, "[", i, "] must be a string"));
    if (v.string_value().empty())
      return Invalid(where, absl::StrCat(field, "[", i, "] must not be empty"));
    out.push_back(v.string_value());
  }
  return out;
}

// An exact queue name, or a valid queue-name prefix and one trailing `*`.
absl::Status ValidatePattern(absl::string_view pattern, absl::string_view field) {
  absl::string_view prefix = pattern;
  if (!prefix.empty() && prefix.back() == '*') prefix.remove_suffix(1);
  if (prefix.find('*') != absl::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        field, " \"", pattern, "\": `*` may only end a pattern (\"billing.*\", or \"*\" alone)"));
  if (prefix.empty()) return absl::OkStatus();  // "*"
  return core::ValidateQueueName(prefix, absl::StrCat(field, " \"", pattern, "\""));
}

absl::StatusOr<TokenEntry> ParseEntry(const Value& value, int index) {
  std::string where = EntryName(index, "");
  if (!value.has_struct_value()) return Invalid(where, "must be an object");
  const Struct& entry = value.struct_value();
  TokenEntry out;
  auto name = entry.fields().find("name");
  if (name != entry.fields().end() && name->second.kind_case() == Value::kStringValue)
    out.name = name->second.string_value();
  where = EntryName(index, out.name);
  for (const auto& [key, unused] : entry.fields()) {
    if (key != "name" && key != "sha256" && key != "token" && key != "roles" && key != "queues")
      return Invalid(where, absl::StrCat("unknown field \"", key,
                                         "\" (known: name, sha256, token, roles, queues)"));
  }
  if (out.name.empty()) return Invalid(where, "name is required (a non-empty string)");

  auto hash = entry.fields().find("sha256");
  auto token = entry.fields().find("token");
  const bool has_hash = hash != entry.fields().end();
  const bool has_token = token != entry.fields().end();
  if (has_hash == has_token)
    return Invalid(where, "give exactly one of sha256 (hex SHA-256 of the token) and token");
  if (has_hash) {
    if (hash->second.kind_case() != Value::kStringValue ||
        !ParseHexDigest(hash->second.string_value(), &out.sha256))
      return Invalid(where, "sha256 must be 64 hex digits (the SHA-256 of the token)");
  } else {
    // The message never quotes the value: it may be a real token.
    if (token->second.kind_case() != Value::kStringValue || token->second.string_value().empty())
      return Invalid(where, "token must be a non-empty string");
    out.sha256 = Sha256(token->second.string_value());
  }

  absl::StatusOr<std::vector<std::string>> roles = Strings(entry, "roles", where);
  if (!roles.ok()) return roles.status();
  for (size_t i = 0; i < roles->size(); ++i) {
    const std::string& r = (*roles)[i];
    auto known = std::find_if(std::begin(kRoles), std::end(kRoles),
                              [&r](Role role) { return RoleName(role) == r; });
    if (known == std::end(kRoles))
      return Invalid(where, absl::StrCat("roles[", i, "]: unknown role \"", r,
                                         "\" (producer, worker, admin or peer)"));
    if (std::find(out.roles.begin(), out.roles.end(), *known) == out.roles.end())
      out.roles.push_back(*known);
  }

  const bool peer_only = out.roles == std::vector<Role>{Role::kPeer};
  if (peer_only && entry.fields().find("queues") == entry.fields().end()) return out;
  absl::StatusOr<std::vector<std::string>> queues = Strings(entry, "queues", where);
  if (!queues.ok()) return queues.status();
  for (size_t i = 0; i < queues->size(); ++i) {
    if (absl::Status s = ValidatePattern((*queues)[i], absl::StrCat("queues[", i, "]")); !s.ok())
      return Invalid(where, s.message());
  }
  out.queues = *std::move(queues);
  return out;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kProducer:
      return "producer";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kPeer:
      return "peer";
  }
  return "unknown";
}

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

absl::StatusOr<std::vector<TokenEntry>> ParseAuthTokens(absl::string_view json) {
  Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root);
  // protobuf's message may quote the text near the error, which can be a plaintext token.
  if (!parsed.ok()) return absl::InvalidArgumentError("not valid JSON (an object with \"tokens\")");
  for (const auto& [key, unused] : root.fields()) {
    if (key != "tokens") return Invalid("file", absl::StrCat("unknown field \"", key, "\""));
  }
  auto tokens = root.fields().find("tokens");
  if (tokens == root.fields().end() || !tokens->second.has_list_value())
    return Invalid("tokens", "is required: a list of token entries");
  const ListValue& list = tokens->second.list_value();
  if (list.values_size() == 0)
    return Invalid("tokens", "must list at least one token (an empty list would refuse everyone)");

  std::vector<TokenEntry> out;
  std::map<std::string, int> names;
  std::map<Sha256Digest, int> digests;
  for (int i = 0; i < list.values_size(); ++i) {
    absl::StatusOr<TokenEntry> entry = ParseEntry(list.values(i), i);
    if (!entry.ok()) return entry.status();
    if (auto [it, added] = names.emplace(entry->name, i); !added)
      return Invalid(EntryName(i, entry->name),
                     absl::StrCat("name is already used by tokens[", it->second, "]"));
    if (auto [it, added] = digests.emplace(entry->sha256, i); !added)
      return Invalid(
          EntryName(i, entry->name),
          absl::StrCat("the same token (sha256) is already ",
                       EntryName(it->second, out[it->second].name), ": one token, one entry"));
    out.push_back(*std::move(entry));
  }
  return out;
}

absl::StatusOr<std::vector<TokenEntry>> LoadAuthTokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens ", path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<TokenEntry>> tokens = ParseAuthTokens(text.str());
  if (!tokens.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-tokens ", path, ": ", tokens.status().message()));
  return tokens;
}

}  // namespace jobbroker::server
