#include "server/http_server.h"

#include "absl/strings/str_cat.h"
#include "civetweb.h"
#include "prometheus/text_serializer.h"

namespace jobbroker {
namespace {

void Reply(::mg_connection* conn, int code, const char* reason, const char* type,
           const std::string& body) {
  mg_printf(
      conn,
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
      code, reason, type, body.size());
  mg_write(conn, body.data(), body.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::vector<const prometheus::Collectable*> collectables,
    HttpTlsFiles tls) {
  if (absl::Status s = CheckHttpTls(tls); !s.ok()) return s;
  std::unique_ptr<HttpServer> server(new HttpServer());
  for (const prometheus::Collectable* c : collectables) server->AddCollectable(c);
  // With TLS, civetweb serves plain HTTP on a loopback port that only the TLS front reaches.
  const std::string listening = tls.enabled() ? "127.0.0.1:0" : address;
  const char* options[] = {"listening_ports", listening.c_str(), "num_threads", "4", nullptr};
  mg_callbacks callbacks{};
  server->ctx_ = mg_start(&callbacks, nullptr, options);
  if (server->ctx_ == nullptr)
    return absl::UnavailableError(absl::StrCat("--http-listen: cannot listen on ", listening));
  mg_set_request_handler(server->ctx_, "/healthz", &HttpServer::HandleHealth, server.get());
  mg_set_request_handler(server->ctx_, "/metrics", &HttpServer::HandleMetrics, server.get());
  mg_set_request_handler(server->ctx_, "/readyz", &HttpServer::HandleReady, server.get());
  mg_server_port ports[4];
  int n = mg_get_server_ports(server->ctx_, 4, ports);
  if (n < 1) return absl::InternalError("--http-listen: no listening port");
  server->port_ = ports[0].port;
  if (tls.enabled()) {
    absl::StatusOr<std::unique_ptr<TlsFront>> front = TlsFront::Start(address, server->port_, tls);
    if (!front.ok()) return front.status();
    server->front_ = *std::move(front);
    server->port_ = server->front_->port();
  }
  return server;
}

HttpServer::~HttpServer() {
  front_.reset();  // first: it relays to civetweb
  if (ctx_ != nullptr) mg_stop(ctx_);
}

int HttpServer::HandleHealth(::mg_connection* conn, void* self) {
  if (static_cast<HttpServer*>(self)->serving_.load()) {
    Reply(conn, 200, "OK", "text/plain", "ok\n");
  } else {
    Reply(conn, 503, "Service Unavailable", "text/plain", "shutting down\n");
  }
  return 200;
}

int HttpServer::HandleReady(::mg_connection* conn, void* self) {
  auto* server = static_cast<HttpServer*>(self);
  if (server->ready_.load() && server->serving_.load()) {
    Reply(conn, 200, "OK", "text/plain", "ready\n");
  } else {
    Reply(conn, 503, "Service Unavailable", "text/plain", "not ready\n");
  }
  return 200;
}

int HttpServer::HandleMetrics(::mg_connection* conn, void* self) {
  auto* server = static_cast<HttpServer*>(self);
  std::vector<const prometheus::Collectable*> collectables;
  {
    absl::MutexLock lock(&server->mu_);
    collectables = server->collectables_;
  }
  std::vector<prometheus::MetricFamily> families;
  for (const prometheus::Collectable* c : collectables) {
    for (auto& f : c->Collect()) families.push_back(std::move(f));
  }
  Reply(conn, 200, "OK", "text/plain; version=0.0.4",
        prometheus::TextSerializer().Serialize(families));
  return 200;
}

}  // namespace jobbroker
