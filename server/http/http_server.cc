#include "server/http/http_server.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "civetweb.h"
#include "prometheus/text_serializer.h"
#include "server/http/ui_assets.h"

namespace jobbroker::server {
namespace {

// Requests to the API are small (a policy, a list of states); anything larger is a mistake.
constexpr long long kMaxApiBodyBytes = 1 << 20;

// The dashboard runs only its own files and talks only to this server; it is never framed.
constexpr char kUiHeaders[] =
    "Content-Security-Policy: default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action "
    "'self'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    // The files change with the binary: always ask whether they did.
    "Cache-Control: no-cache\r\n";

// `extra_headers`: whole header lines, each ending in \r\n. No body is sent for a HEAD request.
void Reply(::mg_connection* conn, int code, const char* reason, const char* type,
           absl::string_view body, absl::string_view extra_headers = "") {
  const std::string head = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                                        "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                        "Connection: close\r\n\r\n");
  mg_write(conn, head.data(), head.size());
  const char* method = mg_get_request_info(conn)->request_method;
  if (method == nullptr || std::string(method) != "HEAD") mg_write(conn, body.data(), body.size());
}

std::string Header(const ::mg_connection* conn, const char* name) {
  const char* value = mg_get_header(conn, name);
  return value == nullptr ? "" : value;
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
  mg_set_request_handler(server->ctx_, "/api/", &HttpServer::HandleApi, server.get());
  // Last: civetweb takes the first handler whose URI prefixes the request's.
  mg_set_request_handler(server->ctx_, "/", &HttpServer::HandleUi, server.get());
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

int HttpServer::HandleApi(::mg_connection* conn, void* self) {
  auto* server = static_cast<HttpServer*>(self);
  const HttpHandler* api = server->api_.load();
  if (api == nullptr) {
    std::function<std::string()> describe;
    {
      absl::MutexLock lock(&server->mu_);
      describe = server->starting_status_;
    }
    const HttpReply reply =
        ErrorReply(503, absl::StatusCode::kUnavailable,
                   describe ? absl::StrCat("the broker is starting: ", describe())
                            : "the broker is starting: its recovery has not finished");
    Reply(conn, reply.status, "Service Unavailable", reply.content_type.c_str(), reply.body);
    return 503;
  }
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest request;
  request.method = info->request_method == nullptr ? "" : info->request_method;
  request.path = info->local_uri == nullptr ? "" : info->local_uri;
  request.query = info->query_string == nullptr ? "" : info->query_string;
  request.authorization = Header(conn, "Authorization");
  request.content_type = Header(conn, "Content-Type");
  auto too_large = [conn] {
    Reply(conn, 413, "Payload Too Large", "application/json",
          absl::StrCat("{\"code\":\"INVALID_ARGUMENT\",\"message\":\"body: over ", kMaxApiBodyBytes,
                       " bytes\"}\n"));
    return 413;
  };
  // The declared length first; a chunked body (no length) is cut off as it arrives.
  if (info->content_length > kMaxApiBodyBytes) return too_large();
  char buffer[8192];
  for (int n; (n = mg_read(conn, buffer, sizeof(buffer))) > 0;) {
    request.body.append(buffer, static_cast<size_t>(n));
    if (static_cast<long long>(request.body.size()) > kMaxApiBodyBytes) return too_large();
  }
  const HttpReply reply = api->Handle(request);
  std::string headers = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n";
  if (!reply.allow.empty()) absl::StrAppend(&headers, "Allow: ", reply.allow, "\r\n");
  Reply(conn, reply.status, mg_get_response_code_text(conn, reply.status),
        reply.content_type.c_str(), reply.body, headers);
  return reply.status;
}

int HttpServer::HandleUi(::mg_connection* conn, void*) {
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string method = info->request_method == nullptr ? "" : info->request_method;
  if (method != "GET" && method != "HEAD") {
    Reply(conn, 405, "Method Not Allowed", "text/plain", "GET or HEAD\n", "Allow: GET, HEAD\r\n");
    return 405;
  }
  UiAsset asset;
  if (info->local_uri == nullptr || !FindUiAsset(info->local_uri, &asset)) {
    Reply(conn, 404, "Not Found", "text/plain", "not found\n");
    return 404;
  }
  const std::string type(asset.content_type);
  Reply(conn, 200, "OK", type.c_str(), asset.body, kUiHeaders);
  return 200;
}

}  // namespace jobbroker::server
