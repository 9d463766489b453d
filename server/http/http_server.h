#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "server/http/http_handler.h"
#include "server/http/http_tls.h"
#include "server/http/tls_front.h"

struct mg_context;
struct mg_connection;

namespace jobbroker::server {

// The HTTP side (--http-listen): GET /healthz (liveness: 200 "ok" until shutdown starts),
// GET /readyz (200 once SetReady(true): recovery finished and gRPC serves; 503 before and
// while shutting down), GET /metrics (Prometheus text format), the dashboard's JSON API under
// /api/v1/ (once SetApi; 503 before) and the dashboard's files (ui/, embedded) at /. It starts
// before recovery so liveness answers during a long one. Collectables and the API are borrowed
// and must outlive the server.
class HttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one), over TLS if `tls` is enabled.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, std::vector<const prometheus::Collectable*> collectables,
      HttpTlsFiles tls = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void SetServing(bool serving) { serving_.store(serving); }
  void SetReady(bool ready) { ready_.store(ready); }
  // Adds a collectable to /metrics (e.g. once the broker exists).
  void AddCollectable(const prometheus::Collectable* c) {
    absl::MutexLock lock(&mu_);
    collectables_.push_back(c);
  }
  // Serves /api/v1/ with `api` (once gRPC serves: the API calls it).
  void SetApi(const HttpHandler* api) { api_.store(api); }
  // Until SetApi, /api/v1/ answers 503 UNAVAILABLE "the broker is starting: <describe()>", so
  // that the dashboard shows how far the recovery got. Unset: without the details.
  void SetStartingStatus(std::function<std::string()> describe) {
    absl::MutexLock lock(&mu_);
    starting_status_ = std::move(describe);
  }

 private:
  HttpServer() = default;
  static int HandleHealth(::mg_connection* conn, void* self);
  static int HandleMetrics(::mg_connection* conn, void* self);
  static int HandleReady(::mg_connection* conn, void* self);
  static int HandleApi(::mg_connection* conn, void* self);
  static int HandleUi(::mg_connection* conn, void* self);

  ::mg_context* ctx_ = nullptr;
  std::unique_ptr<TlsFront> front_;  // with TLS: listens on the address, relays to ctx_
  int port_ = 0;
  std::atomic<bool> serving_{true};
  std::atomic<bool> ready_{false};
  std::atomic<const HttpHandler*> api_{nullptr};
  absl::Mutex mu_;
  std::vector<const prometheus::Collectable*> collectables_ ABSL_GUARDED_BY(mu_);
  std::function<std::string()> starting_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
