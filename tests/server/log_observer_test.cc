// What the LogObserver writes to stderr, read back through gtest's stderr capture.
#include "server/observability/log_observer.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/observability/log.h"

namespace jobbroker::server {
namespace {

using ::testing::ElementsAre;

// The "recovering" lines of `log`, each as "partition:jobs_so_far".
std::vector<std::string> RecoveringLines(absl::string_view log) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    if (!absl::StrContains(line, "recovering")) continue;
    std::string partition, jobs;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      if (absl::ConsumePrefix(&field, "partition=")) partition = std::string(field);
      if (absl::ConsumePrefix(&field, "jobs_so_far=")) jobs = std::string(field);
    }
    out.push_back(partition + ":" + jobs);
  }
  return out;
}

class LogObserverTest : public ::testing::Test {
 protected:
  void SetUp() override { Log::Configure(LogLevel::kInfo, LogFormat::kText); }
  void TearDown() override { Log::Configure(LogLevel::kInfo, LogFormat::kJson); }
};

// The broker reports a recovery's progress each second (for /metrics); the log says it every
// five seconds of each partition's own recovery, and a partition that starts again starts over.
TEST_F(LogObserverTest, ARecoveryIsLoggedEveryFiveSecondsOfEachPartitionsOwnRecovery) {
  LogObserver log;
  ::testing::internal::CaptureStderr();
  log.RecoveryStarted(0);
  for (int s = 1; s <= 11; ++s) {
    log.Recovering(0, 1000 * s, absl::Seconds(s));
    if (s == 3) log.RecoveryStarted(1);
    if (s > 3) log.Recovering(1, 10 * s, absl::Seconds(s - 3));
  }
  log.Recovered(1, 110, 0, absl::Seconds(8));
  // Partition 1 rebuilt again (a lead taken): its first line comes 5 s into that recovery.
  log.RecoveryStarted(1);
  for (int s = 1; s <= 5; ++s) log.Recovering(1, 7 * s, absl::Seconds(s));
  const std::string written = ::testing::internal::GetCapturedStderr();

  EXPECT_THAT(RecoveringLines(written), ElementsAre("0:5000", "1:80", "0:10000", "1:35"))
      << written;
  EXPECT_TRUE(absl::StrContains(written, "recovered")) << written;
}

// Irregular reports (a chunk may take longer than a second): a line once five seconds have
// passed since the last one, not only on whole multiples of five.
TEST_F(LogObserverTest, ARecoveryLineComesOnceFiveSecondsPassedSinceTheLastOne) {
  LogObserver log;
  ::testing::internal::CaptureStderr();
  log.RecoveryStarted(2);
  size_t jobs = 0;
  for (int ms : {1500, 4900, 6200, 9000, 11100, 11300, 17000}) {
    log.Recovering(2, ++jobs, absl::Milliseconds(ms));
  }
  // 6.2 s (5 after none), 11.3 s (5.1 after 6.2; 11.1 was 4.9 after), 17 s.
  EXPECT_THAT(RecoveringLines(::testing::internal::GetCapturedStderr()),
              ElementsAre("2:3", "2:6", "2:7"));
}

}  // namespace
}  // namespace jobbroker::server
