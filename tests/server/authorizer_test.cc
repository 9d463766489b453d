// Who may call what: bearer token lookup, queue patterns and the role table.
#include "server/auth/authorizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"

namespace jobbroker::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TokenEntry Token(std::string name, const std::string& secret, std::vector<Role> roles,
                 std::vector<std::string> queues) {
  return TokenEntry{.name = std::move(name),
                    .sha256 = Sha256(secret),
                    .roles = std::move(roles),
                    .queues = std::move(queues)};
}

class AuthorizerTest : public ::testing::Test {
 protected:
  AuthorizerTest()
      : authorizer_(
            {Token("billing-producer", "tok-producer", {Role::kProducer}, {"billing.*", "emails"}),
             Token("ops", "tok-admin", {Role::kAdmin}, {"*"}),
             Token("all-roles", "tok-all", {Role::kProducer, Role::kWorker, Role::kAdmin},
                   {"reports"})}) {}

  absl::StatusOr<const TokenEntry*> Auth(std::vector<absl::string_view> values) {
    return authorizer_.Authenticate(values);
  }

  const Authorizer authorizer_;
};

TEST(QueuePatternTest, ExactNamesAndTrailingStarPrefixes) {
  EXPECT_TRUE(QueuePatternMatches("emails", "emails"));
  EXPECT_FALSE(QueuePatternMatches("emails", "emails2"));
  EXPECT_FALSE(QueuePatternMatches("emails", "email"));
  EXPECT_TRUE(QueuePatternMatches("billing.*", "billing.eu"));
  EXPECT_TRUE(QueuePatternMatches("billing.*", "billing."));
  EXPECT_FALSE(QueuePatternMatches("billing.*", "billing"));
  EXPECT_FALSE(QueuePatternMatches("billing.*", "xbilling.eu"));
  EXPECT_TRUE(QueuePatternMatches("bill*", "billing"));
  EXPECT_TRUE(QueuePatternMatches("*", "anything"));
  EXPECT_TRUE(QueuePatternMatches("*", ""));
  // Matching is case-sensitive, as queue names are.
  EXPECT_FALSE(QueuePatternMatches("Emails", "emails"));
}

TEST_F(AuthorizerTest, FindsTheEntryOfAKnownToken) {
  absl::StatusOr<const TokenEntry*> producer = Auth({"Bearer tok-producer"});
  ASSERT_TRUE(producer.ok()) << producer.status();
  EXPECT_EQ((*producer)->name, "billing-producer");
  absl::StatusOr<const TokenEntry*> admin = Auth({"Bearer tok-admin"});
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ((*admin)->name, "ops");
  // The scheme is case-insensitive (RFC 7235); the token is not.
  absl::StatusOr<const TokenEntry*> lower = Auth({"bearer tok-all"});
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_EQ((*lower)->name, "all-roles");
  EXPECT_EQ(Auth({"Bearer TOK-ALL"}).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthorizerTest, RefusesMissingMalformedAndUnknownTokensWithoutEchoingThem) {
  const std::vector<std::pair<std::vector<absl::string_view>, std::string>> cases = {
      {{}, "authorization: missing"},
      {{"Bearer tok-admin", "Bearer tok-admin"}, "authorization: give one value"},
      {{"Basic dXNlcjpwYXNz"}, "authorization: must be `Bearer <token>`"},
      {{"tok-admin"}, "authorization: must be `Bearer <token>`"},
      {{"Bearer"}, "authorization: must be `Bearer <token>`"},
      {{"Bearer "}, "authorization: the bearer token is empty"},
      {{"Bearer guessed-wrong"}, "authorization: unknown bearer token"},
      // A prefix or extension of a real token is a different token.
      {{"Bearer tok-admi"}, "authorization: unknown bearer token"},
      {{"Bearer tok-admin2"}, "authorization: unknown bearer token"},
  };
  for (const auto& [values, message] : cases) {
    absl::StatusOr<const TokenEntry*> caller = Auth(values);
    ASSERT_FALSE(caller.ok()) << message;
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kUnauthenticated) << message;
    EXPECT_THAT(caller.status().message(),
                AllOf(HasSubstr(message), Not(HasSubstr("tok-")), Not(HasSubstr("guessed"))));
  }
}

TEST_F(AuthorizerTest, TheRoleTable) {
  const TokenEntry& producer = **Auth({"Bearer tok-producer"});
  const TokenEntry& admin = **Auth({"Bearer tok-admin"});
  const TokenEntry& all = **Auth({"Bearer tok-all"});
  struct Case {
    const TokenEntry* token;
    Role role;
    std::string queue;
    bool allowed;
  };
  const std::vector<Case> cases = {
      {&producer, Role::kProducer, "billing.eu", true},
      {&producer, Role::kProducer, "emails", true},
      {&producer, Role::kProducer, "reports", false},
      {&producer, Role::kWorker, "emails", false},
      {&producer, Role::kAdmin, "emails", false},
      // admin implies neither producer nor worker.
      {&admin, Role::kAdmin, "anything", true},
      {&admin, Role::kProducer, "anything", false},
      {&admin, Role::kWorker, "anything", false},
      {&all, Role::kProducer, "reports", true},
      {&all, Role::kWorker, "reports", true},
      {&all, Role::kAdmin, "reports", true},
      {&all, Role::kWorker, "emails", false},
      {&all, Role::kAdmin, "reports2", false},
  };
  for (const Case& c : cases) {
    absl::Status s = Authorizer::Allow(*c.token, c.role, c.queue);
    SCOPED_TRACE(testing::Message() << c.token->name << " " << RoleName(c.role) << " " << c.queue);
    if (c.allowed) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
      // The message names the token, the role needed and the queue.
      EXPECT_THAT(s.message(), AllOf(HasSubstr("\"" + c.token->name + "\""),
                                     HasSubstr(std::string(RoleName(c.role))),
                                     HasSubstr("\"" + c.queue + "\"")));
    }
  }
}

TEST_F(AuthorizerTest, RoleOnlyChecksAndQueueMatching) {
  const TokenEntry& producer = **Auth({"Bearer tok-producer"});
  EXPECT_TRUE(Authorizer::AllowRole(producer, Role::kProducer).ok());
  absl::Status worker = Authorizer::AllowRole(producer, Role::kWorker);
  EXPECT_EQ(worker.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(worker.message(), AllOf(HasSubstr("\"billing-producer\""), HasSubstr("worker")));
  EXPECT_TRUE(Authorizer::MatchesQueue(producer, "billing.us"));
  EXPECT_TRUE(Authorizer::MatchesQueue(producer, "emails"));
  EXPECT_FALSE(Authorizer::MatchesQueue(producer, "reports"));
}

}  // namespace
}  // namespace jobbroker::server
