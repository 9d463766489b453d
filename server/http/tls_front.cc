#include "server/http/tls_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace jobbroker::server {
namespace {

constexpr int kIdleTimeoutMs = 30000;
constexpr int kHandshakeTimeoutSec = 10;

// "host:port", "[v6]:port" -> host and port strings for getaddrinfo.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  absl::string_view h(address.data(), colon);
  absl::ConsumePrefix(&h, "[");
  absl::ConsumeSuffix(&h, "]");
  *host = std::string(h);
  *port = address.substr(colon + 1);
  return !port->empty();
}

int Listen(const std::string& address, int* port) {
  std::string host, service;
  if (!SplitHostPort(address, &host, &service)) return -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0)
    return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t sent = send(fd, data, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

bool SslWriteAll(SSL* ssl, const char* data, size_t n) {
  while (n > 0) {
    int wrote = SSL_write(ssl, data, static_cast<int>(n));
    if (wrote <= 0) return false;
    data += wrote;
    n -= static_cast<size_t>(wrote);
  }
  return true;
}

// Moves bytes both ways until either side closes, fails or stays silent for kIdleTimeoutMs.
void Relay(SSL* ssl, int client_fd, int backend_fd) {
  char buf[16384];
  for (;;) {
    bool client_ready = SSL_pending(ssl) > 0;
    bool backend_ready = false;
    if (!client_ready) {
      pollfd fds[2] = {{client_fd, POLLIN, 0}, {backend_fd, POLLIN, 0}};
      int n = poll(fds, 2, kIdleTimeoutMs);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      client_ready = fds[0].revents != 0;
      backend_ready = fds[1].revents != 0;
    }
    if (client_ready) {
      int got = SSL_read(ssl, buf, sizeof(buf));
      if (got <= 0 || !SendAll(backend_fd, buf, static_cast<size_t>(got))) return;
    }
    if (backend_ready) {
      ssize_t got = recv(backend_fd, buf, sizeof(buf), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0 || !SslWriteAll(ssl, buf, static_cast<size_t>(got))) return;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFront>> TlsFront::Start(const std::string& address,
                                                          int backend_port,
                                                          const HttpTlsFiles& tls) {
  // A client that goes away mid-write must cost an error return, not the process: OpenSSL writes
  // with plain write(2).
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<TlsFront> front(new TlsFront());
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("HTTP TLS: cannot create an OpenSSL context");
  front->ssl_ctx_ = ctx;
  if (absl::Status s = ConfigureHttpTls(ctx, tls); !s.ok()) return s;
  front->backend_port_ = backend_port;
  front->listen_fd_ = Listen(address, &front->port_);
  if (front->listen_fd_ < 0)
    return absl::UnavailableError(
        absl::StrCat("--http-listen: cannot listen on ", address, ": ", std::strerror(errno)));
  if (pipe2(front->wake_fds_, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  front->acceptor_ = std::thread([f = front.get()] { f->AcceptLoop(); });
  return front;
}

TlsFront::~TlsFront() {
  if (acceptor_.joinable()) {
    char stop = 1;
    (void)!write(wake_fds_[1], &stop, 1);
    acceptor_.join();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Unblocks every connection thread's poll, read or handshake at once.
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) close(fd);
  }
  if (ssl_ctx_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(ssl_ctx_));
}

void TlsFront::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_ || running_ >= kMaxConnections) {
      close(client);
      continue;
    }
    ++running_;
    open_fds_.insert(client);
    std::thread([this, client] { Serve(client); }).detach();
  }
}

void TlsFront::Serve(int client_fd) {
  timeval handshake{kHandshakeTimeoutSec, 0};
  setsockopt(client_fd, SOL_SOCKET, SO_RCVTIMEO, &handshake, sizeof(handshake));
  setsockopt(client_fd, SOL_SOCKET, SO_SNDTIMEO, &handshake, sizeof(handshake));
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(ssl_ctx_));
  if (ssl != nullptr && SSL_set_fd(ssl, client_fd) == 1 && SSL_accept(ssl) == 1) {
    int backend = ConnectLoopback(backend_port_);
    if (backend >= 0) {
      Relay(ssl, client_fd, backend);
      close(backend);
    }
    SSL_shutdown(ssl);
  }
  if (ssl != nullptr) SSL_free(ssl);
  absl::MutexLock lock(&mu_);
  open_fds_.erase(client_fd);
  close(client_fd);
  --running_;
}

}  // namespace jobbroker::server
