// QueueIndex: queues made on first use, and the policy layers: built-ins, the config file's
// default policy, its per-queue policy, the run-time override.
#include "core/queue_index.h"

#include "gtest/gtest.h"

namespace jobbroker::core {
namespace {

TEST(QueueIndexTest, APolicyIsBuiltInsThenDefaultThenQueueThenRuntime) {
  PolicyOverride defaults;
  defaults.max_length = 100;
  defaults.max_concurrency = 3;
  std::map<std::string, PolicyOverride> configured;
  configured["emails"].max_concurrency = 5;
  QueueIndex queues(defaults, configured);

  EXPECT_EQ(queues.Get("other").policy.max_concurrency, 3);
  QueueState& emails = queues.Get("emails");
  EXPECT_EQ(emails.policy.max_concurrency, 5);
  EXPECT_EQ(emails.policy.max_length, 100);
  EXPECT_EQ(emails.policy.lease_duration, QueuePolicy{}.lease_duration) << "a built-in";

  PolicyOverride runtime;
  runtime.max_concurrency = 9;
  queues.SetRuntime(emails, runtime);
  EXPECT_EQ(emails.policy.max_concurrency, 9);
  EXPECT_EQ(emails.policy.max_length, 100);
  queues.SetRuntime(emails, PolicyOverride{});
  EXPECT_EQ(emails.policy.max_concurrency, 5) << "dropping the override falls back to the config";
}

TEST(QueueIndexTest, FindNeverCreatesAndGetCreatesOnce) {
  PolicyOverride defaults;
  std::map<std::string, PolicyOverride> configured;
  QueueIndex queues(defaults, configured);
  EXPECT_EQ(queues.Find("q"), nullptr);
  QueueState& q = queues.Get("q");
  EXPECT_EQ(&queues.Get("q"), &q);
  EXPECT_EQ(queues.Find("q"), &q);
  EXPECT_EQ(queues.size(), 1u);
}

TEST(QueueIndexTest, ConfiguredQueuesExistBeforeTheirFirstJob) {
  PolicyOverride defaults;
  std::map<std::string, PolicyOverride> configured{{"a", {}}, {"b", {}}};
  QueueIndex queues(defaults, configured);
  queues.CreateConfigured();
  std::vector<std::string> names;
  for (auto& [name, q] : queues) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace jobbroker::core
