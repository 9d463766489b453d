#include "server/http/admin_http_api.h"

#include <grpcpp/client_context.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace jobbroker::server {
namespace {

constexpr absl::string_view kPrefix = "/api/v1/";
// A bulk redrive or purge of a large queue answers once its last batch is durable.
constexpr absl::Duration kCallTimeout = absl::Seconds(60);

// The HTTP status of a gRPC code, as google/rpc/code.proto pairs them.
int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

HttpReply Error(const absl::Status& s) {
  return ErrorReply(HttpStatusOf(s.code()), s.code(), s.message());
}

HttpReply Json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  // Zeros and empty strings are printed: a dashboard reads "attempt": 0 rather than guessing.
  options.always_print_primitive_fields = true;
  HttpReply reply;
  auto printed = google::protobuf::util::MessageToJsonString(message, &reply.body, options);
  if (!printed.ok())
    return Error(absl::InternalError(absl::StrCat("JSON: ", printed.message().as_string())));
  reply.body += "\n";
  return reply;
}

template <typename Request, typename Response>
using AdminMethod = grpc::Status (v1::Admin::Stub::*)(grpc::ClientContext*, const Request&,
                                                      Response*);

// One Admin call, answered as JSON.
template <typename Request, typename Response>
HttpReply Call(v1::Admin::Stub& admin, AdminMethod<Request, Response> method,
               const Request& request, const HttpRequest& http) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  if (!http.authorization.empty()) ctx.AddMetadata("authorization", http.authorization);
  Response response;
  grpc::Status s = (admin.*method)(&ctx, request, &response);
  if (!s.ok())
    return Error(absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message()));
  return Json(response);
}

// The body (proto3 JSON of the request message; empty = {}) into `request`.
absl::Status ParseBody(const HttpRequest& http, google::protobuf::Message* request) {
  if (absl::StripAsciiWhitespace(http.body).empty()) return absl::OkStatus();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt field is refused, not ignored
  auto parsed = google::protobuf::util::JsonStringToMessage(http.body, request, options);
  if (!parsed.ok())
    return absl::InvalidArgumentError(absl::StrCat("body: ", parsed.message().as_string()));
  return absl::OkStatus();
}

// The queue or job id the path names into `field`: the body may repeat it, not contradict it.
absl::Status SetFromPath(std::string* field, absl::string_view name, absl::string_view value) {
  if (!field->empty() && *field != value)
    return absl::InvalidArgumentError(
        absl::StrCat("body: ", name, " \"", *field, "\" contradicts the path's \"", value, "\""));
  *field = std::string(value);
  return absl::OkStatus();
}

// A change: the body into a Request, the path's queue or job id into `field`, then the call.
template <typename Request, typename Response>
HttpReply Change(v1::Admin::Stub& admin, AdminMethod<Request, Response> method,
                 const HttpRequest& http, std::string* (Request::*field)(),
                 absl::string_view field_name, absl::string_view value) {
  Request request;
  absl::Status s = ParseBody(http, &request);
  if (s.ok()) s = SetFromPath((request.*field)(), field_name, value);
  if (!s.ok()) return Error(s);
  return Call(admin, method, request, http);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(static_cast<unsigned char>(c));
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// A query value: "+" is a space and %XX a byte; a broken escape is kept as it is.
std::string QueryDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
               HexValue(text[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// ListJobs' query parameters, named as the request's JSON fields.
absl::Status ParseListJobsQuery(absl::string_view query, v1::ListJobsRequest* request) {
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    const std::string key = QueryDecode(kv.first);
    const std::string value = QueryDecode(kv.second);
    auto invalid = [&key](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": ", what));
    };
    if (key == "state") {
      v1::JobState state;
      if (!v1::JobState_Parse(value, &state))
        return invalid(absl::StrCat("\"", value, "\" is not a JobState (JOB_STATE_READY, ...)"));
      request->set_state(state);
    } else if (key == "pageSize") {
      int32_t size = 0;
      if (!absl::SimpleAtoi(value, &size)) return invalid("must be an integer");
      request->set_page_size(size);
    } else if (key == "pageToken") {
      request->set_page_token(value);
    } else if (key == "newestFirst") {
      if (value != "true" && value != "false") return invalid("must be true or false");
      request->set_newest_first(value == "true");
    } else if (key == "dedupKey") {
      request->set_dedup_key(value);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown query parameter \"", key,
                       "\"; ListJobs takes state, pageSize, pageToken, newestFirst and dedupKey"));
    }
  }
  return absl::OkStatus();
}

HttpReply MethodNotAllowed(const HttpRequest& http, std::string allow) {
  HttpReply reply = ErrorReply(405, absl::StatusCode::kUnimplemented,
                               absl::StrCat(http.method, " ", http.path, ": allowed: ", allow));
  reply.allow = std::move(allow);
  return reply;
}

}  // namespace

AdminHttpApi::AdminHttpApi(std::shared_ptr<grpc::ChannelInterface> channel)
    : admin_(v1::Admin::NewStub(std::move(channel))) {}

HttpReply AdminHttpApi::Handle(const HttpRequest& http) const {
  absl::string_view rest = http.path;
  if (!absl::ConsumePrefix(&rest, kPrefix))
    return ErrorReply(404, absl::StatusCode::kNotFound, absl::StrCat("no route ", http.path));
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '/');
  const bool get = http.method == "GET";
  const bool post = http.method == "POST";
  const bool del = http.method == "DELETE";
  // A cross-site page can make a browser send a form POST, but not one with a JSON content type
  // (that needs a CORS preflight, which is never granted), so changes demand it.
  if ((post || del) && !absl::StartsWithIgnoreCase(http.content_type, "application/json"))
    return ErrorReply(415, absl::StatusCode::kInvalidArgument,
                      "Content-Type: changes take application/json (an empty body or {} when there "
                      "is nothing to say)");
  v1::Admin::Stub& admin = *admin_;

  if (parts.size() >= 2 && parts[0] == "queues" && !parts[1].empty()) {
    const absl::string_view queue = parts[1];
    if (parts.size() == 2) {
      if (!get) return MethodNotAllowed(http, "GET");
      v1::GetQueueRequest request;
      request.set_queue(std::string(queue));
      return Call(admin, &v1::Admin::Stub::GetQueue, request, http);
    }
    if (parts.size() != 3)
      return ErrorReply(404, absl::StatusCode::kNotFound, absl::StrCat("no route ", http.path));
    const absl::string_view action = parts[2];
    if (action == "jobs") {
      if (!get) return MethodNotAllowed(http, "GET");
      v1::ListJobsRequest request;
      request.set_queue(std::string(queue));
      if (absl::Status s = ParseListJobsQuery(http.query, &request); !s.ok()) return Error(s);
      return Call(admin, &v1::Admin::Stub::ListJobs, request, http);
    }
    if (action == "workers") {
      if (!get) return MethodNotAllowed(http, "GET");
      v1::ListWorkersRequest request;
      request.set_queue(std::string(queue));
      return Call(admin, &v1::Admin::Stub::ListWorkers, request, http);
    }
    if (action == "pause" || action == "resume" || action == "purge" || action == "retry" ||
        action == "policy") {
      if (!post) return MethodNotAllowed(http, "POST");
    }
    if (action == "pause")
      return Change(admin, &v1::Admin::Stub::PauseQueue, http,
                    &v1::PauseQueueRequest::mutable_queue, "queue", queue);
    if (action == "resume")
      return Change(admin, &v1::Admin::Stub::ResumeQueue, http,
                    &v1::ResumeQueueRequest::mutable_queue, "queue", queue);
    if (action == "purge")
      return Change(admin, &v1::Admin::Stub::PurgeQueue, http,
                    &v1::PurgeQueueRequest::mutable_queue, "queue", queue);
    if (action == "retry")
      return Change(admin, &v1::Admin::Stub::RetryJob, http, &v1::RetryJobRequest::mutable_queue,
                    "queue", queue);
    if (action == "policy")
      return Change(admin, &v1::Admin::Stub::UpdateQueuePolicy, http,
                    &v1::UpdateQueuePolicyRequest::mutable_queue, "queue", queue);
  }
  if (parts.size() == 1 && parts[0] == "cluster") {
    if (!get) return MethodNotAllowed(http, "GET");
    return Call(admin, &v1::Admin::Stub::GetCluster, v1::GetClusterRequest(), http);
  }
  if (parts.size() == 1 && parts[0] == "workers") {
    if (!get) return MethodNotAllowed(http, "GET");
    return Call(admin, &v1::Admin::Stub::ListWorkers, v1::ListWorkersRequest(), http);
  }
  if (parts.size() == 1 && parts[0] == "schedules") {
    if (!get) return MethodNotAllowed(http, "GET");
    return Call(admin, &v1::Admin::Stub::ListSchedules, v1::ListSchedulesRequest(), http);
  }
  if (parts.size() >= 2 && parts[0] == "schedules" && !parts[1].empty()) {
    const std::string id(parts[1]);
    if (parts.size() == 2) {
      if (get) {
        v1::GetScheduleRequest request;
        request.set_schedule_id(id);
        return Call(admin, &v1::Admin::Stub::GetSchedule, request, http);
      }
      if (post) {
        // The body is the Schedule itself; the path names it.
        v1::PutScheduleRequest request;
        absl::Status s = ParseBody(http, request.mutable_schedule());
        if (s.ok())
          s = SetFromPath(request.mutable_schedule()->mutable_schedule_id(), "scheduleId", id);
        if (!s.ok()) return Error(s);
        return Call(admin, &v1::Admin::Stub::PutSchedule, request, http);
      }
      if (del) {
        return Change(admin, &v1::Admin::Stub::DeleteSchedule, http,
                      &v1::DeleteScheduleRequest::mutable_schedule_id, "scheduleId", id);
      }
      return MethodNotAllowed(http, "GET, POST, DELETE");
    }
    if (parts.size() == 3 && parts[2] == "trigger") {
      if (!post) return MethodNotAllowed(http, "POST");
      return Change(admin, &v1::Admin::Stub::TriggerSchedule, http,
                    &v1::TriggerScheduleRequest::mutable_schedule_id, "scheduleId", id);
    }
    return ErrorReply(404, absl::StatusCode::kNotFound, absl::StrCat("no route ", http.path));
  }
  if (parts.size() == 1 && parts[0] == "queues") {
    if (!get) return MethodNotAllowed(http, "GET");
    return Call(admin, &v1::Admin::Stub::ListQueues, v1::ListQueuesRequest(), http);
  }
  if (parts.size() >= 2 && parts[0] == "jobs" && !parts[1].empty()) {
    const std::string job_id(parts[1]);
    if (parts.size() == 2) {
      if (get) {
        v1::GetJobRequest request;
        request.set_job_id(job_id);
        return Call(admin, &v1::Admin::Stub::GetJob, request, http);
      }
      if (del) {
        return Change(admin, &v1::Admin::Stub::DeleteJob, http,
                      &v1::DeleteJobRequest::mutable_job_id, "jobId", job_id);
      }
      return MethodNotAllowed(http, "GET, DELETE");
    }
    if (parts.size() == 3 && (parts[2] == "cancel" || parts[2] == "retry")) {
      if (!post) return MethodNotAllowed(http, "POST");
      if (parts[2] == "cancel")
        return Change(admin, &v1::Admin::Stub::CancelJob, http,
                      &v1::CancelJobRequest::mutable_job_id, "jobId", job_id);
      return Change(admin, &v1::Admin::Stub::RetryJob, http, &v1::RetryJobRequest::mutable_job_id,
                    "jobId", job_id);
    }
  }
  return ErrorReply(404, absl::StatusCode::kNotFound, absl::StrCat("no route ", http.path));
}

}  // namespace jobbroker::server
