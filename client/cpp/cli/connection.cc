#include "client/cpp/cli/connection.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::cli {
namespace {

absl::Status ReadToken(const std::string& path, std::string& token) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  // Files made with `echo` end in a newline that is not part of the token.
  token = std::string(absl::StripAsciiWhitespace(text.str()));
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": is empty"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyConnectionFlags(const ParsedArgs& args, client::ClientOptions& options) {
  if (auto path = args.Get("--token-file")) {
    if (absl::Status s = ReadToken(*path, options.token); !s.ok()) return s;
  } else {
    options.token = client::DefaultToken();
  }

  const bool tls = args.Has("--tls") || args.Has("--tls-ca") || args.Has("--tls-cert") ||
                   args.Has("--tls-key") || args.Has("--tls-server-name");
  if (!tls) return absl::OkStatus();
  if (args.Has("--tls-cert") != args.Has("--tls-key"))
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  client::TlsOptions files;
  for (auto [flag, pem] :
       {std::pair{"--tls-ca", &files.ca_pem}, std::pair{"--tls-cert", &files.cert_pem},
        std::pair{"--tls-key", &files.key_pem}}) {
    std::optional<std::string> path = args.Get(flag);
    if (!path.has_value()) continue;
    absl::StatusOr<std::string> text = client::ReadPemFile(*path);
    if (!text.ok())
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", text.status().message()));
    *pem = *std::move(text);
  }
  files.server_name = args.Get("--tls-server-name").value_or("");
  options.tls = std::move(files);
  return absl::OkStatus();
}

}  // namespace jobbroker::cli
