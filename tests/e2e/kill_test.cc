// The scenario that teaches why a durable broker exists: a worker process "sends" a welcome
// email and dies with SIGKILL before it can ack; another worker process takes over.
// Nobody is missed. Without idempotency exactly one user gets two emails; with the job's
// idempotency_key passed to a provider that skips keys it has seen, nobody does.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

extern char** environ;

namespace jobbroker::testing {
namespace {

constexpr int kUsers = 20;
constexpr char kConfig[] = R"({
  "defaultPolicy": {
    "retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
              "jitter": "JITTER_NONE"}
  }
})";

pid_t SpawnWorker(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string binary = SIGNUP_WORKER_BINARY;
  argv.push_back(binary.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

int WaitForExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// Emails per user, from the fake provider's outbox.
std::map<std::string, int> EmailsPerUser(const std::string& outbox) {
  std::ifstream in(outbox);
  std::map<std::string, int> per_user;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    ++per_user[parts[0]];
  }
  return per_user;
}

class KillTest : public BrokerFixtureWithParam<bool> {
 protected:
  KillTest() : BrokerFixtureWithParam({.config_json = kConfig}) {}
};

TEST_P(KillTest, AWorkerKilledBeforeItsAckLosesNoJob) {
  const bool idempotent = GetParam();
  std::vector<std::string> ids;
  for (int i = 0; i < kUsers; ++i) {
    v1::EnqueueRequest req;
    req.set_queue("signups");
    req.set_payload(absl::StrCat("user_", i));
    req.set_dedup_key(absl::StrCat("welcome-user_", i));  // the idempotency key of every attempt
    ids.push_back(client().MustEnqueue(req));
  }
  std::string outbox = process().temp_dir().path() + "/outbox.txt";
  std::vector<std::string> args = {"--address", process().address(), "--outbox", outbox};
  if (idempotent) args.push_back("--idempotent");

  std::vector<std::string> dying = args;
  dying.insert(dying.end(), {"--die-after", "user_6"});
  pid_t first = SpawnWorker(dying);
  ASSERT_GT(first, 0);
  int status = WaitForExit(first);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the first worker should have killed itself after user_6's email";
  EXPECT_EQ(client().MustGetJob(ids[6]).state(), v1::JOB_STATE_ACTIVE) << "sent but never acked";

  pid_t second = SpawnWorker(args);
  ASSERT_GT(second, 0);
  bool all_done =
      WaitFor([&] { return client().Counts("signups")["JOB_STATE_COMPLETED"] == kUsers; },
              absl::Seconds(60));
  kill(second, SIGTERM);
  int second_status = WaitForExit(second);
  ASSERT_TRUE(all_done) << "not every signup completed";
  EXPECT_TRUE(WIFEXITED(second_status) && WEXITSTATUS(second_status) == 0);

  std::map<std::string, int> emails = EmailsPerUser(outbox);
  int duplicates = 0;
  for (int i = 0; i < kUsers; ++i) {
    std::string user = absl::StrCat("user_", i);
    EXPECT_GE(emails[user], 1) << user << " was never emailed";
    duplicates += std::max(0, emails[user] - 1);
  }
  EXPECT_EQ(emails.size(), static_cast<size_t>(kUsers));
  v1::Job retried = client().MustGetJob(ids[6]);
  EXPECT_EQ(retried.attempts_size(), 2);
  EXPECT_EQ(retried.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
  if (idempotent) {
    EXPECT_EQ(duplicates, 0) << "the provider saw the same key and skipped the repeat";
  } else {
    EXPECT_EQ(duplicates, 1) << "user_6 was emailed once by each worker";
    EXPECT_EQ(emails["user_6"], 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Idempotency, KillTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithIdempotencyKey" : "WithoutIdempotencyKey";
                         });

}  // namespace
}  // namespace jobbroker::testing
