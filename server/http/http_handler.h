#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace jobbroker::server {

// One HTTP request as the handlers below see it: the transport (civetweb) is left outside, so
// the handlers are plain functions of their input.
struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string path;           // percent-decoded, without the query: "/api/v1/queues/emails"
  std::string query;          // raw, without the "?": "state=JOB_STATE_FAILED&pageSize=50"
  std::string authorization;  // the Authorization header, or ""
  std::string content_type;   // the Content-Type header, or ""
  std::string body;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  // the Allow header of a 405, else ""
};

// {"code": "NOT_FOUND", "message": "..."} with `http_status`: the API's refusals, and the
// server's own before the API serves. Printed through protobuf's JSON, so the message is escaped
// whatever it holds.
HttpReply ErrorReply(int http_status, absl::StatusCode code, absl::string_view message);

// Answers requests under one path prefix. Thread-safe: called from several HTTP threads.
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  virtual HttpReply Handle(const HttpRequest& request) const = 0;
};

}  // namespace jobbroker::server
