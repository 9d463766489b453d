#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

struct mg_context;
struct mg_connection;

namespace jobbroker {

// The HTTP side (--http-listen): GET /healthz (200 "ok" while serving, 503 while shutting
// down) and GET /metrics (Prometheus text format). Collectables are borrowed and must outlive
// the server.
class HttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, std::vector<const prometheus::Collectable*> collectables);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void SetServing(bool serving) { serving_.store(serving); }

 private:
  HttpServer() = default;
  static int HandleHealth(::mg_connection* conn, void* self);
  static int HandleMetrics(::mg_connection* conn, void* self);

  ::mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::atomic<bool> serving_{true};
  std::vector<const prometheus::Collectable*> collectables_;
};

}  // namespace jobbroker
