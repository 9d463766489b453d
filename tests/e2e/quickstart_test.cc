// The README's example programs, run as a user would, against the real broker.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

using ExamplesTest = BrokerFixture;

TEST_F(ExamplesTest, QuickstartEnqueuesWorksAndCompletesAJob) {
  std::string command = std::string(QUICKSTART_BINARY) + " " + process().address() + " 2>&1";
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  char buf[512];
  while (fgets(buf, sizeof buf, out) != nullptr) text += buf;
  int status = pclose(out);
  EXPECT_EQ(status, 0) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("idempotency_key welcome-ada"));
  EXPECT_THAT(text, ::testing::HasSubstr("is JOB_STATE_COMPLETED"));
}

TEST_F(ExamplesTest, EmailWorkerWorksJobsAndStopsOnSigterm) {
  std::string good = client().MustEnqueue("emails", "ada@example.com");
  std::string bad = client().MustEnqueue("emails", "not-an-address");

  // The example reads the broker's address from JOBBROKER_ADDRESS, as every client does.
  std::string env_address = "JOBBROKER_ADDRESS=" + process().address();
  std::vector<char*> env = {env_address.data(), nullptr};
  std::string binary = EMAIL_WORKER_BINARY;
  char* argv[] = {binary.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv, env.data()), 0);
  bool done = WaitFor(
      [&] {
        return client().MustGetJob(good).state() == v1::JOB_STATE_COMPLETED &&
               client().MustGetJob(bad).state() == v1::JOB_STATE_FAILED;
      },
      absl::Seconds(30));
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(done);
  EXPECT_EQ(client().MustGetJob(bad).fail_reason(), v1::FAIL_REASON_PERMANENT);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace jobbroker::testing
