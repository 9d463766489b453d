#include "server/http/http_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace jobbroker::server {
namespace {

// OpenSSL keeps its reasons on a per-thread queue; take the newest and clear the rest so a
// later failure does not report a stale one.
std::string OpenSslReason() {
  unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::Status Bad(const char* flag, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", OpenSslReason()));
}

}  // namespace

absl::Status ConfigureHttpTls(void* ssl_ctx, const HttpTlsFiles& files) {
  SSL_CTX* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1)
    return absl::InternalError(absl::StrCat("HTTP TLS: ", OpenSslReason()));
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1)
    return Bad("--http-tls-cert", files.cert);
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return Bad("--http-tls-key", files.key);
  if (SSL_CTX_check_private_key(ctx) != 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-tls-key ", files.key, " does not belong to --http-tls-cert ", files.cert));
  if (!files.client_ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, files.client_ca.c_str(), nullptr) != 1)
      return Bad("--http-tls-client-ca", files.client_ca);
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca.c_str());
    if (names == nullptr) return Bad("--http-tls-client-ca", files.client_ca);
    SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return absl::OkStatus();
}

absl::Status CheckHttpTls(const HttpTlsFiles& files) {
  if (!files.enabled()) return absl::OkStatus();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_server_method()),
                                                        &SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("HTTP TLS: ", OpenSslReason()));
  return ConfigureHttpTls(ctx.get(), files);
}

}  // namespace jobbroker::server
