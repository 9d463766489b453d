#pragma once

// gMock matchers for absl::Status, absl::StatusOr<T> and grpc::Status (a call through a channel),
// so that a failed check prints the whole
// status (code and message) instead of two numbers:
//
//   EXPECT_THAT(broker.Ack(stale), StatusIs(absl::StatusCode::kFailedPrecondition));
//   EXPECT_THAT(broker.RetryJob(""), StatusIs(absl::StatusCode::kInvalidArgument,
//                                            HasSubstr("job_id")));
//   ASSERT_THAT(store.Write(batch), IsOk());

#include <grpcpp/support/status.h>

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace jobbroker::testing {
namespace internal {

inline absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
// gRPC's codes have the same numbers as absl's.
inline absl::Status StatusOf(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace internal

// Matches an OK status, or an absl::StatusOr<T> that holds a value.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status status = internal::StatusOf(arg);
  if (!status.ok()) *result_listener << "which is " << status;
  return status.ok();
}

// Matches a status (or StatusOr) whose code is `code` (an absl::StatusCode, or a
// grpc::StatusCode: the numbers are the same).
MATCHER_P(StatusIs, code,
          std::string(negation ? "has a code other than " : "has code ") +
              absl::StatusCodeToString(static_cast<absl::StatusCode>(code))) {
  const absl::Status status = internal::StatusOf(arg);
  *result_listener << "which is " << status;
  return static_cast<int>(status.code()) == static_cast<int>(code);
}

// Matches a status (or StatusOr) whose code is `code` and whose message matches
// `message_matcher` (a string, or a matcher such as HasSubstr).
MATCHER_P2(StatusIs, code, message_matcher,
           std::string(negation ? "does not have code " : "has code ") +
               absl::StatusCodeToString(static_cast<absl::StatusCode>(code)) +
               " and a message that " + ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status status = internal::StatusOf(arg);
  *result_listener << "which is " << status;
  return static_cast<int>(status.code()) == static_cast<int>(code) &&
         ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(message_matcher))(
             std::string(status.message()));
}

}  // namespace jobbroker::testing
