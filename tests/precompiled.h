// The headers nearly every test binary parses: the standard library's, Abseil's, GoogleTest's,
// gRPC's and the API's generated messages. Compiled once (tests/CMakeLists.txt) and reused by
// every jobbroker_test binary, they cut a test file's compile by about 30% (four test files at
// the release preset's -O0: 33.0 s to 22.6 s); CI builds every test file cold in two presets.
// No header of our own sources goes here but the generated ones (they change only with proto/,
// which rebuilds every test anyway), so editing a test helper does not rebuild every test.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
