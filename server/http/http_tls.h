#pragma once

#include <string>

#include "absl/status/status.h"

namespace jobbroker::server {

// The HTTP endpoint's TLS files (--http-tls-*), PEM. No cert: plain HTTP.
struct HttpTlsFiles {
  std::string cert;       // certificate chain, leaf first
  std::string key;        // its private key
  std::string client_ca;  // set: clients must present a certificate this CA signed (mTLS)

  bool enabled() const { return !cert.empty(); }
};

// Sets up `ssl_ctx` (an OpenSSL SSL_CTX*, as civetweb hands it over): TLS 1.2 or newer, the
// chain and the key (checked to match), and with client_ca a required, verified client
// certificate. kInvalidArgument naming the flag and OpenSSL's reason.
absl::Status ConfigureHttpTls(void* ssl_ctx, const HttpTlsFiles& files);

// The same on a throwaway context, so a bad file is reported at start (and by --check-config)
// rather than by the first scrape.
absl::Status CheckHttpTls(const HttpTlsFiles& files);

}  // namespace jobbroker::server
