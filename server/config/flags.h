#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace jobbroker::server {

// The server's command line (DESIGN.md "Server flags").
struct ServerFlags {
  std::string listen = "127.0.0.1:7070";       // gRPC
  std::string http_listen = "127.0.0.1:8080";  // /metrics, /healthz
  std::string data_dir = "./data";
  std::string config;               // optional ServerConfig JSON file
  std::string log_level = "info";   // debug | info | warn | error
  std::string log_format = "json";  // json | text
  std::string metrics = "on";       // on | off (off: no job/RPC/WAL metrics, for measuring cost)
  // gRPC over TLS: PEM files. Both or neither; tls_client_ca (mTLS) needs both.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;  // clients must present a certificate this CA signed
  // The HTTP endpoint (/metrics, /healthz, /readyz) over TLS, separately from gRPC: a scraper
  // may need another certificate than the workers. Same rules as the gRPC ones.
  std::string http_tls_cert;
  std::string http_tls_key;
  std::string http_tls_client_ca;
  // JSON file of bearer tokens with roles and queue patterns (server/auth_tokens.h). Empty: no
  // authentication, every caller may call every RPC.
  std::string auth_tokens;
  // Open Work streams at once, over all clients (1 to 1000000).
  int max_work_streams = 10000;
  // Jobs kept whole in memory (BrokerOptions::max_hot_jobs); past it, waiting jobs are index
  // entries only and are read back from disk when leased. 0 to 1000000000.
  int64_t max_hot_jobs = 100'000;
  // Queues with a `queue` label of their own in /metrics (server/queue_labels.h); later ones are
  // counted under queue="(other)". 0: no limit. 0 to 1000000.
  int64_t metrics_max_queues = 1000;
  bool check_config = false;  // validate the flags and --config, print the verdict, exit
  bool help = false;
};

// Accepts "--flag value" and "--flag=value". kInvalidArgument naming an unknown flag, a
// missing value, or flags that only make sense together (the TLS files).
absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv);

inline constexpr char kUsage[] =
    "usage: jobbroker [--listen HOST:PORT] [--http-listen HOST:PORT] [--data-dir DIR]\n"
    "                 [--config FILE] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]\n"
    "                 [--check-config]\n"
    "  --listen       gRPC address (default 127.0.0.1:7070; port 0 picks a free port)\n"
    "  --http-listen  /metrics and /healthz (default 127.0.0.1:8080)\n"
    "  --data-dir     where jobs are kept (default ./data)\n"
    "  --config       policies, proto3 JSON of jobbroker.v1.ServerConfig\n"
    "  --log-level    debug | info | warn | error (default info)\n"
    "  --log-format   json | text (default json: one object per line on stderr)\n"
    "  --metrics      on | off (default on; off drops job, RPC and WAL metrics)\n"
    "  --metrics-max-queues  queues labelled by name in /metrics (default 1000; 0: all);\n"
    "                 later ones are counted together under queue=\"(other)\"\n"
    "  --tls-cert     gRPC over TLS: the server's certificate chain (PEM)\n"
    "  --tls-key      its private key (PEM)\n"
    "  --tls-client-ca  require client certificates signed by this CA (PEM): mutual TLS\n"
    "  --http-tls-cert, --http-tls-key, --http-tls-client-ca\n"
    "                 the same for the HTTP endpoint (HTTPS, optionally mutual)\n"
    "  --auth-tokens  require a bearer token on every Broker and Admin call: a JSON file of\n"
    "                 tokens (their SHA-256), each with roles and queue patterns\n"
    "  --max-work-streams  open Work streams allowed at once, over all workers (default 10000)\n"
    "  --max-hot-jobs  jobs kept whole in memory (default 100000, about 100 MB); waiting jobs\n"
    "                 past it take about 90 bytes each and are read from disk when leased\n"
    "  --check-config validate the flags, the --config file and the TLS files, say so, exit\n"
    "                 (0 if the broker would start with them, 1 otherwise)\n";

}  // namespace jobbroker::server
