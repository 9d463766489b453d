#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace jobbroker::testing {

// A plain HTTP/1.1 GET of `path` from `address` ("host:port", IPv4) over a fresh connection;
// returns the whole response (status line, headers, body) as received, or "" if the connection
// failed. For asserting on headers and status lines as they are on the wire.
std::string HttpGet(const std::string& address, const std::string& path,
                    absl::Duration timeout = absl::Seconds(30));

struct HttpResponse {
  int status = 0;       // 200, 503, ...
  std::string headers;  // the header lines as received, without the status line
  std::string body;     // de-chunked if the server sent Transfer-Encoding: chunked
};

// HttpGet, parsed. UNAVAILABLE if the connection failed or the response is not HTTP; the
// status code of the answer is in HttpResponse::status, not in the returned Status.
absl::StatusOr<HttpResponse> HttpGetResponse(const std::string& address, const std::string& path,
                                             absl::Duration timeout = absl::Seconds(30));

// Any request: `headers` are whole header lines without their CRLF ("Content-Type: x"); a
// non-empty `body` is sent with its Content-Length. Parsed as HttpGetResponse.
absl::StatusOr<HttpResponse> HttpSend(const std::string& address, const std::string& method,
                                      const std::string& path,
                                      const std::vector<std::string>& headers = {},
                                      const std::string& body = "",
                                      absl::Duration timeout = absl::Seconds(30));

// The value of the first sample line of `metrics` (Prometheus text) whose series is exactly
// `series` (a name, with its labels as printed: name{label="value"}), or -1 if there is none.
double Sample(const std::string& metrics, const std::string& series);

// Percent-encodes everything but RFC 3986's unreserved characters, for query parameters
// (a PromQL query is full of braces, quotes and spaces).
std::string UrlEncode(absl::string_view text);

}  // namespace jobbroker::testing
