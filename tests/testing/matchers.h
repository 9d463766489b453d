#pragma once

// The matchers tests use, by their short names: ours for absl::Status and grpc::Status
// (status_matchers.h) and gMock's. Inside jobbroker::testing a plain `testing::` names this
// namespace, not gMock's, so without these each test would list its own `using ::testing::...`.

#include "gmock/gmock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::testing {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Le;
using ::testing::Not;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

}  // namespace jobbroker::testing
