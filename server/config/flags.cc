#include "server/config/flags.h"

#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace jobbroker::server {

absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv) {
  ServerFlags flags;
  std::string max_work_streams;
  std::string max_hot_jobs;
  std::string metrics_max_queues;
  std::map<absl::string_view, std::string*> values = {
      {"--max-work-streams", &max_work_streams},
      {"--max-hot-jobs", &max_hot_jobs},
      {"--metrics-max-queues", &metrics_max_queues},
      {"--listen", &flags.listen},
      {"--http-listen", &flags.http_listen},
      {"--data-dir", &flags.data_dir},
      {"--config", &flags.config},
      {"--log-level", &flags.log_level},
      {"--log-format", &flags.log_format},
      {"--metrics", &flags.metrics},
      {"--tls-cert", &flags.tls_cert},
      {"--tls-key", &flags.tls_key},
      {"--tls-client-ca", &flags.tls_client_ca},
      {"--auth-tokens", &flags.auth_tokens},
      {"--http-tls-cert", &flags.http_tls_cert},
      {"--http-tls-key", &flags.http_tls_key},
      {"--http-tls-client-ca", &flags.http_tls_client_ca},
  };
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      continue;
    }
    if (arg == "--check-config") {
      flags.check_config = true;
      continue;
    }
    absl::string_view name = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    }
    auto it = values.find(name);
    if (it == values.end()) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    if (!value.has_value()) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      value = argv[++i];
    }
    if (value->empty() && name != "--config")
      return absl::InvalidArgumentError(absl::StrCat(name, " must not be empty"));
    *it->second = std::move(*value);
  }
  if (!max_work_streams.empty() && (!absl::SimpleAtoi(max_work_streams, &flags.max_work_streams) ||
                                    flags.max_work_streams < 1 || flags.max_work_streams > 1000000))
    return absl::InvalidArgumentError("--max-work-streams must be a number from 1 to 1000000");
  if (!max_hot_jobs.empty() && (!absl::SimpleAtoi(max_hot_jobs, &flags.max_hot_jobs) ||
                                flags.max_hot_jobs < 0 || flags.max_hot_jobs > 1'000'000'000))
    return absl::InvalidArgumentError("--max-hot-jobs must be a number from 0 to 1000000000");
  if (!metrics_max_queues.empty() &&
      (!absl::SimpleAtoi(metrics_max_queues, &flags.metrics_max_queues) ||
       flags.metrics_max_queues < 0 || flags.metrics_max_queues > 1'000'000))
    return absl::InvalidArgumentError("--metrics-max-queues must be a number from 0 to 1000000");
  if (flags.tls_cert.empty() != flags.tls_key.empty())
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  if (!flags.tls_client_ca.empty() && flags.tls_cert.empty())
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  if (flags.http_tls_cert.empty() != flags.http_tls_key.empty())
    return absl::InvalidArgumentError(
        "--http-tls-cert and --http-tls-key go together: give both or neither");
  if (!flags.http_tls_client_ca.empty() && flags.http_tls_cert.empty())
    return absl::InvalidArgumentError(
        "--http-tls-client-ca needs --http-tls-cert and --http-tls-key");
  return flags;
}

}  // namespace jobbroker::server
