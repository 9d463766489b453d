// The README's quickstart program, run as a user would, against the real broker.
#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

TEST(QuickstartTest, EnqueuesWorksAndCompletesAJob) {
  auto broker = BrokerProcess::Start();
  ASSERT_TRUE(broker.ok()) << broker.status();
  std::string command = std::string(QUICKSTART_BINARY) + " " + (*broker)->address() + " 2>&1";
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

}  // namespace
}  // namespace jobbroker::testing
