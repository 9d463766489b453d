#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace jobbroker::server {

// The code and message of an absl::Status, an absl::StatusOr or a grpc::Status, so that one
// matcher serves the units (absl) and the calls through a channel (grpc).
inline int CodeOf(const absl::Status& s) { return static_cast<int>(s.code()); }
inline int CodeOf(const grpc::Status& s) { return static_cast<int>(s.error_code()); }
template <typename T>
int CodeOf(const absl::StatusOr<T>& s) {
  return CodeOf(s.status());
}
inline std::string MessageOf(const absl::Status& s) { return std::string(s.message()); }
inline std::string MessageOf(const grpc::Status& s) { return s.error_message(); }
template <typename T>
std::string MessageOf(const absl::StatusOr<T>& s) {
  return MessageOf(s.status());
}

// EXPECT_THAT(FromProto(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delay")));
// A failure prints the code and the message.
MATCHER_P2(StatusIs, code, message_matcher,
           absl::StrCat("has code ", static_cast<int>(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message_matcher))) {
  *result_listener << "code " << CodeOf(arg) << ": \"" << MessageOf(arg) << "\"";
  return CodeOf(arg) == static_cast<int>(code) &&
         ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(message_matcher))(
             MessageOf(arg));
}

MATCHER(IsOk, "is OK") {
  *result_listener << "code " << CodeOf(arg) << ": \"" << MessageOf(arg) << "\"";
  return CodeOf(arg) == 0;
}

}  // namespace jobbroker::server
