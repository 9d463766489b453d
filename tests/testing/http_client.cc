#include "tests/testing/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace jobbroker::testing {
namespace {

// Decodes a chunked body: hex size line, data, CRLF, ..., a zero-size chunk. Go servers
// (Prometheus) answer HTTP/1.1 with chunks once a body outgrows their buffer.
absl::StatusOr<std::string> Dechunk(absl::string_view chunked) {
  std::string body;
  while (true) {
    const size_t eol = chunked.find("\r\n");
    if (eol == absl::string_view::npos) return absl::UnavailableError("truncated chunk header");
    absl::string_view size_text = chunked.substr(0, eol);
    size_text = size_text.substr(0, size_text.find(';'));  // chunk extensions
    size_t size = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &size)) {
      return absl::UnavailableError(absl::StrCat("bad chunk size: ", size_text));
    }
    chunked.remove_prefix(eol + 2);
    if (size == 0) return body;
    if (chunked.size() < size) return absl::UnavailableError("truncated chunk");
    body.append(chunked.data(), size);
    chunked.remove_prefix(size);
    if (absl::StartsWith(chunked, "\r\n")) chunked.remove_prefix(2);
  }
}

// The whole response as received, or "" if the connection failed.
std::string Exchange(const std::string& address, const std::string& request,
                     absl::Duration timeout) {
  std::vector<std::string> host_port = absl::StrSplit(address, ':');
  int port = 0;
  if (host_port.size() != 2 || !absl::SimpleAtoi(host_port[1], &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  // Per-read and per-write bounds: a server that hangs fails the test instead of stalling it.
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, host_port[0].c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) response.append(buf, n);
  close(fd);
  return response;
}

}  // namespace

std::string HttpGet(const std::string& address, const std::string& path, absl::Duration timeout) {
  return Exchange(
      address,
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address, "\r\nConnection: close\r\n\r\n"),
      timeout);
}

absl::StatusOr<HttpResponse> HttpGetResponse(const std::string& address, const std::string& path,
                                             absl::Duration timeout) {
  return HttpSend(address, "GET", path, {}, "", timeout);
}

absl::StatusOr<HttpResponse> HttpSend(const std::string& address, const std::string& method,
                                      const std::string& path,
                                      const std::vector<std::string>& headers,
                                      const std::string& body, absl::Duration timeout) {
  std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", address, "\r\nConnection: close\r\n");
  for (const std::string& h : headers) absl::StrAppend(&request, h, "\r\n");
  if (!body.empty()) absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  absl::StrAppend(&request, "\r\n", body);
  const std::string raw = Exchange(address, request, timeout);
  if (raw.empty())
    return absl::UnavailableError(absl::StrCat(method, " ", address, path, " failed"));
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat(method, " ", address, path, ": no end of headers in ", raw.substr(0, 200)));
  }
  absl::string_view head(raw.data(), head_end);
  const size_t status_end = head.find("\r\n");
  absl::string_view status_line = head.substr(0, status_end);
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  HttpResponse response;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/") ||
      !absl::SimpleAtoi(parts[1], &response.status)) {
    return absl::UnavailableError(
        absl::StrCat(method, " ", address, path, ": bad status line ", status_line));
  }
  if (status_end != absl::string_view::npos)
    response.headers = std::string(head.substr(status_end + 2));
  absl::string_view received(raw);
  received.remove_prefix(head_end + 4);
  bool chunked = false;
  for (absl::string_view line : absl::StrSplit(response.headers, "\r\n")) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(kv.first), "transfer-encoding") &&
        absl::StrContains(absl::AsciiStrToLower(kv.second), "chunked")) {
      chunked = true;
    }
  }
  if (!chunked) {
    response.body = std::string(received);
    return response;
  }
  absl::StatusOr<std::string> dechunked = Dechunk(received);
  if (!dechunked.ok()) return dechunked.status();
  response.body = *std::move(dechunked);
  return response;
}

std::string UrlEncode(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
  return out;
}

double Sample(const std::string& metrics, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double v = -1;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
  }
  return -1;
}

}  // namespace jobbroker::testing
