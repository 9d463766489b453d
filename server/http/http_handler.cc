#include "server/http/http_handler.h"

#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace jobbroker::server {

HttpReply ErrorReply(int http_status, absl::StatusCode code, absl::string_view message) {
  google::protobuf::Struct error;
  (*error.mutable_fields())["code"].set_string_value(absl::StatusCodeToString(code));
  (*error.mutable_fields())["message"].set_string_value(std::string(message));
  HttpReply reply{.status = http_status};
  google::protobuf::util::MessageToJsonString(error, &reply.body);
  reply.body += "\n";
  return reply;
}

}  // namespace jobbroker::server
