#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace jobbroker {

// The server's command line (DESIGN.md "Server flags").
struct ServerFlags {
  std::string listen = "127.0.0.1:7070";       // gRPC
  std::string http_listen = "127.0.0.1:8080";  // /metrics, /healthz
  std::string data_dir = "./data";
  std::string config;  // optional ServerConfig JSON file
  bool help = false;
};

// Accepts "--flag value" and "--flag=value". kInvalidArgument naming an unknown flag or a
// missing value.
absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv);

inline constexpr char kUsage[] =
    "usage: jobbroker [--listen HOST:PORT] [--http-listen HOST:PORT] [--data-dir DIR]\n"
    "                 [--config FILE]\n"
    "  --listen       gRPC address (default 127.0.0.1:7070; port 0 picks a free port)\n"
    "  --http-listen  /metrics and /healthz (default 127.0.0.1:8080)\n"
    "  --data-dir     where jobs are kept (default ./data)\n"
    "  --config       policies, proto3 JSON of jobbroker.v1.ServerConfig\n";

}  // namespace jobbroker
