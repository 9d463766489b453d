// The --auth-tokens file: what it accepts, and that every refusal names the entry and field.
#include "server/auth/auth_tokens.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace jobbroker::server {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// SHA-256("s3cret"), as `printf %s s3cret | sha256sum` prints it.
constexpr char kSecretHex[] = "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0";

std::string Hex(const Sha256Digest& d) {
  std::string out;
  for (uint8_t b : d) absl::StrAppend(&out, absl::Hex(b, absl::kZeroPad2));
  return out;
}

// One entry with `fields` spliced in, wrapped as a whole file.
std::string File(const std::string& entries) {
  return absl::StrCat(R"({"tokens": [)", entries, "]}");
}

std::string Entry(const std::string& name, const std::string& extra = "") {
  return absl::StrCat(R"({"name": ")", name, R"(", "sha256": ")", kSecretHex,
                      R"(", "roles": ["producer"], "queues": ["emails"])", extra, "}");
}

std::string ErrorOf(const std::string& json) {
  absl::StatusOr<std::vector<TokenEntry>> tokens = ParseAuthTokens(json);
  EXPECT_FALSE(tokens.ok()) << "accepted: " << json;
  if (tokens.ok()) return "";
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(tokens.status().message());
}

TEST(Sha256Test, MatchesTheKnownDigest) {
  EXPECT_EQ(Hex(Sha256("s3cret")), kSecretHex);
  EXPECT_EQ(Hex(Sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ParseAuthTokensTest, ReadsEveryField) {
  absl::StatusOr<std::vector<TokenEntry>> tokens = ParseAuthTokens(R"({"tokens": [
      {"name": "billing-producer", "sha256": ")" + std::string(kSecretHex) +
                                                                   R"(",
       "roles": ["producer", "worker"], "queues": ["billing.*", "emails"]},
      {"name": "ops", "token": "plain-dev-token", "roles": ["admin"], "queues": ["*"]}]})");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  const TokenEntry& billing = (*tokens)[0];
  EXPECT_EQ(billing.name, "billing-producer");
  EXPECT_EQ(Hex(billing.sha256), kSecretHex);
  EXPECT_THAT(billing.roles, ElementsAre(Role::kProducer, Role::kWorker));
  EXPECT_THAT(billing.queues, ElementsAre("billing.*", "emails"));
  // A plaintext token is kept only as its digest.
  const TokenEntry& ops = (*tokens)[1];
  EXPECT_EQ(ops.sha256, Sha256("plain-dev-token"));
  EXPECT_THAT(ops.roles, ElementsAre(Role::kAdmin));
  EXPECT_THAT(ops.queues, ElementsAre("*"));
}

TEST(ParseAuthTokensTest, UpperCaseHexAndRepeatedRolesAreAccepted) {
  std::string upper = kSecretHex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  absl::StatusOr<std::vector<TokenEntry>> tokens =
      ParseAuthTokens(File(absl::StrCat(R"({"name": "a", "sha256": ")", upper,
                                        R"(", "roles": ["worker", "worker"], "queues": ["q"]})")));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(Hex((*tokens)[0].sha256), kSecretHex);
  EXPECT_THAT((*tokens)[0].roles, ElementsAre(Role::kWorker));
}

TEST(ParseAuthTokensTest, APeerTokenNeedsNoQueuesButAnyOtherRoleDoes) {
  // What cluster nodes present to each other: the replication service names no queue.
  absl::StatusOr<std::vector<TokenEntry>> tokens =
      ParseAuthTokens(File(R"({"name": "nodes", "token": "p", "roles": ["peer"]})"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT((*tokens)[0].roles, ElementsAre(Role::kPeer));
  EXPECT_TRUE((*tokens)[0].queues.empty());
  EXPECT_EQ(RoleName(Role::kPeer), "peer");
  EXPECT_THAT(ErrorOf(File(R"({"name": "a", "token": "t", "roles": ["peer", "admin"]})")),
              HasSubstr(R"(tokens[0] ("a"): queues is required)"));
}

TEST(ParseAuthTokensTest, RefusesAFileThatIsNotTheExpectedShape) {
  EXPECT_THAT(ErrorOf("not json"), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf("{}"), HasSubstr("tokens: is required"));
  EXPECT_THAT(ErrorOf(R"({"tokens": {}})"), HasSubstr("tokens: is required"));
  EXPECT_THAT(ErrorOf(R"({"tokens": []})"), HasSubstr("tokens: must list at least one token"));
  EXPECT_THAT(ErrorOf(R"({"tokens": [], "extra": 1})"), HasSubstr("unknown field \"extra\""));
  EXPECT_THAT(ErrorOf(File("7")), HasSubstr("tokens[0]: must be an object"));
}

TEST(ParseAuthTokensTest, RefusalsNameTheEntryAndTheField) {
  // Each case: the entry's JSON, then what the message must say.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {Entry("a", R"(, "role": "admin")"), R"(tokens[0] ("a"): unknown field "role")"},
      {R"({"sha256": "00", "roles": ["admin"], "queues": ["q"]})", "tokens[0]: name is required"},
      {R"({"name": "", "token": "t", "roles": ["admin"], "queues": ["q"]})",
       "tokens[0]: name is required"},
      {R"({"name": "a", "roles": ["admin"], "queues": ["q"]})",
       R"(tokens[0] ("a"): give exactly one of sha256)"},
      {Entry("a", R"(, "token": "t")"), R"(tokens[0] ("a"): give exactly one of sha256)"},
      {R"({"name": "a", "sha256": "abc", "roles": ["admin"], "queues": ["q"]})",
       R"(tokens[0] ("a"): sha256 must be 64 hex digits)"},
      {absl::StrCat(R"({"name": "a", "sha256": ")", std::string(63, 'a'),
                    R"(g", "roles": ["admin"], "queues": ["q"]})"),
       R"(tokens[0] ("a"): sha256 must be 64 hex digits)"},
      {R"({"name": "a", "token": "", "roles": ["admin"], "queues": ["q"]})",
       R"(tokens[0] ("a"): token must be a non-empty string)"},
      {R"({"name": "a", "token": "t", "queues": ["q"]})", R"(tokens[0] ("a"): roles is required)"},
      {R"({"name": "a", "token": "t", "roles": [], "queues": ["q"]})",
       R"(tokens[0] ("a"): roles must not be empty)"},
      {R"({"name": "a", "token": "t", "roles": ["producer", "root"], "queues": ["q"]})",
       R"(tokens[0] ("a"): roles[1]: unknown role "root")"},
      {R"({"name": "a", "token": "t", "roles": ["admin"]})",
       R"(tokens[0] ("a"): queues is required)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": "q"})",
       R"(tokens[0] ("a"): queues must be a list)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": ["q", ""]})",
       R"(tokens[0] ("a"): queues[1] must not be empty)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": ["bill*ing"]})",
       R"(tokens[0] ("a"): queues[0] "bill*ing": `*` may only end a pattern)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": ["**"]})",
       R"(tokens[0] ("a"): queues[0] "**": `*` may only end a pattern)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": ["q", "has space*"]})",
       R"(tokens[0] ("a"): queues[1] "has space*" may contain only)"},
      {R"({"name": "a", "token": "t", "roles": ["admin"], "queues": [3]})",
       R"(tokens[0] ("a"): queues[0] must be a string)"},
  };
  for (const auto& [entry, message] : cases) {
    EXPECT_THAT(ErrorOf(File(entry)), HasSubstr(message)) << entry;
  }
}

TEST(ParseAuthTokensTest, RefusesADuplicateNameOrToken) {
  EXPECT_THAT(ErrorOf(File(absl::StrCat(Entry("a"), ",", Entry("a")))),
              HasSubstr(R"(tokens[1] ("a"): name is already used by tokens[0])"));
  EXPECT_THAT(ErrorOf(File(absl::StrCat(Entry("a"), ",", Entry("b")))),
              HasSubstr(R"(tokens[1] ("b"): the same token (sha256) is already tokens[0] ("a"))"));
  // A plaintext token and a digest of the same token are the same token.
  EXPECT_THAT(ErrorOf(File(absl::StrCat(Entry("a"),
                                        R"(, {"name": "b", "token": "s3cret", "roles": ["admin"],)",
                                        R"( "queues": ["*"]})"))),
              HasSubstr(R"(tokens[1] ("b"): the same token (sha256))"));
}

TEST(ParseAuthTokensTest, APlaintextTokenNeverAppearsInAnError) {
  // A duplicate of a plaintext token, and a syntax error right next to one.
  std::string duplicate = File(
      R"({"name": "a", "token": "hunter2-secret", "roles": ["admin"], "queues": ["*"]},
         {"name": "b", "token": "hunter2-secret", "roles": ["admin"], "queues": ["*"]})");
  EXPECT_THAT(ErrorOf(duplicate), Not(HasSubstr("hunter2")));
  EXPECT_THAT(ErrorOf(R"({"tokens": [{"name": "a", "token": "hunter2-secret" "roles": []}]})"),
              AllOf(HasSubstr("not valid JSON"), Not(HasSubstr("hunter2"))));
}

TEST(LoadAuthTokensTest, NamesTheFlagAndPath) {
  absl::StatusOr<std::vector<TokenEntry>> missing = LoadAuthTokens("/nonexistent/tokens.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--auth-tokens /nonexistent/tokens.json: cannot be read"));

  const std::string path = absl::StrCat(::testing::TempDir(), "auth_tokens_test.json");
  std::ofstream(path) << File(Entry("a", R"(, "x": 1)"));
  absl::StatusOr<std::vector<TokenEntry>> bad = LoadAuthTokens(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(
      bad.status().message(),
      HasSubstr(absl::StrCat("--auth-tokens ", path, R"(: tokens[0] ("a"): unknown field)")));

  std::ofstream(path, std::ios::trunc) << File(Entry("a"));
  absl::StatusOr<std::vector<TokenEntry>> good = LoadAuthTokens(path);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->size(), 1u);
}

}  // namespace
}  // namespace jobbroker::server
