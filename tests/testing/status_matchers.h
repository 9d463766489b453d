#pragma once

// gMock matchers for absl::Status and absl::StatusOr<T>, so that a failed check prints the whole
// status (code and message) instead of two numbers:
//
//   EXPECT_THAT(broker.Ack(stale), StatusIs(absl::StatusCode::kFailedPrecondition));
//   EXPECT_THAT(broker.RetryJob(""), StatusIs(absl::StatusCode::kInvalidArgument,
//                                            HasSubstr("job_id")));
//   ASSERT_THAT(store.Write(batch), IsOk());

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace jobbroker::testing {
namespace internal {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

// Matches an OK absl::Status, or an absl::StatusOr<T> that holds a value.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status& status = internal::StatusOf(arg);
  if (!status.ok()) *result_listener << "which is " << status;
  return status.ok();
}

// Matches a status (or StatusOr) whose code is `code`.
MATCHER_P(StatusIs, code,
          std::string(negation ? "has a code other than " : "has code ") +
              absl::StatusCodeToString(code)) {
  const absl::Status& status = internal::StatusOf(arg);
  *result_listener << "which is " << status;
  return status.code() == code;
}

// Matches a status (or StatusOr) whose code is `code` and whose message matches
// `message_matcher` (a string, or a matcher such as HasSubstr).
MATCHER_P2(StatusIs, code, message_matcher,
           std::string(negation ? "does not have code " : "has code ") +
               absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = internal::StatusOf(arg);
  *result_listener << "which is " << status;
  return status.code() == code && ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(
                                      message_matcher))(std::string(status.message()));
}

}  // namespace jobbroker::testing
