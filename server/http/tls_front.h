#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/http/http_tls.h"

namespace jobbroker::server {

// TLS in front of the HTTP endpoint: accepts TLS connections on the --http-listen address and
// relays each, decrypted, to the HTTP server listening on a loopback port. It exists because
// Debian's civetweb is built against the OpenSSL 1.1 API and crashes on its first TLS
// connection when it loads OpenSSL 3 (docs/decisions.md, "HTTPS for /metrics"); relaying keeps
// every HTTP route working over TLS without serving HTTP twice.
//
// A thread per connection, at most kMaxConnections at once (more are closed at once), and every
// connection ends after kIdleTimeout without traffic: a scraper's requests are few and short.
class TlsFront {
 public:
  static constexpr int kMaxConnections = 32;

  // Listens on `address` ("host:port", port 0 picks one) and relays to 127.0.0.1:backend_port.
  static absl::StatusOr<std::unique_ptr<TlsFront>> Start(const std::string& address,
                                                         int backend_port, const HttpTlsFiles& tls);
  // Stops accepting, cuts the open connections and waits for their threads.
  ~TlsFront();
  TlsFront(const TlsFront&) = delete;
  TlsFront& operator=(const TlsFront&) = delete;

  int port() const { return port_; }

 private:
  TlsFront() = default;
  void AcceptLoop();
  void Serve(int client_fd);

  void* ssl_ctx_ = nullptr;  // SSL_CTX*, kept out of the header
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: the destructor writes to stop the accept loop
  int port_ = 0;
  int backend_port_ = 0;
  std::thread acceptor_;

  absl::Mutex mu_;
  absl::flat_hash_set<int> open_fds_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // connection threads not yet finished
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace jobbroker::server
