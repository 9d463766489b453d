// What GrpcEtcd does beyond the conformance suite, against a real etcd: TLS with client
// certificates, several endpoints, and its refusals of bad options.

#include "cluster/etcd/grpc_etcd.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::cluster {
namespace {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

class GrpcEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::TempDir>> dir = testing::TempDir::Create();
    ASSERT_THAT(dir, IsOk());
    dir_ = *std::move(dir);
  }
  void StartEtcd(testing::EtcdTls tls = {}) {
    absl::StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd =
        testing::EtcdProcess::Start(dir_->path() + "/etcd", std::move(tls));
    ASSERT_THAT(etcd, IsOk());
    etcd_ = *std::move(etcd);
  }
  static std::unique_ptr<GrpcEtcd> Client(GrpcEtcdOptions options) {
    absl::StatusOr<std::unique_ptr<GrpcEtcd>> client = GrpcEtcd::Create(std::move(options));
    EXPECT_THAT(client, IsOk());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
};

TEST_F(GrpcEtcdTest, OverTlsWithAClientCertificateItReadsAndWrites) {
  absl::StatusOr<testing::TestPki> pki = testing::MakePki(*dir_);
  ASSERT_THAT(pki, IsOk());
  StartEtcd({pki->server_cert, pki->server_key, pki->ca_cert, pki->client_cert, pki->client_key});
  ASSERT_THAT(etcd_->client_url(), ::testing::StartsWith("https://"));
  auto client = Client({.endpoints = {etcd_->client_url()},
                        .ca_file = pki->ca_cert,
                        .cert_file = pki->client_cert,
                        .key_file = pki->client_key});
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Put("/tls", "yes"), IsOk());
  absl::StatusOr<GetResult> got = client->Get("/tls");
  ASSERT_THAT(got, IsOk());
  ASSERT_THAT(got->kvs, SizeIs(1));
  EXPECT_EQ(got->kvs[0].value, "yes");

  // Without a client certificate etcd refuses the connection.
  auto anonymous = Client({.endpoints = {etcd_->client_url()},
                           .call_timeout = absl::Seconds(2),
                           .ca_file = pki->ca_cert});
  ASSERT_NE(anonymous, nullptr);
  EXPECT_THAT(anonymous->Get("/tls"), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(GrpcEtcdTest, AReadSkipsAnEndpointThatIsDownAndAWriteIsNotRetried) {
  StartEtcd();
  absl::StatusOr<int> dead_port = testing::FreeLoopbackPort();  // nothing listens there
  ASSERT_THAT(dead_port, IsOk());
  const std::string dead = absl::StrCat("http://127.0.0.1:", *dead_port);
  auto client = Client({.endpoints = {dead, etcd_->client_url()},
                        .call_timeout = absl::Seconds(5),
                        .connect_timeout = absl::Milliseconds(200)});
  ASSERT_NE(client, nullptr);
  // A write on the dead endpoint fails (its outcome could be unknown) and names it...
  EXPECT_THAT(client->Put("/w", "1"), StatusIs(absl::StatusCode::kUnavailable, HasSubstr(dead)));
  // ...and the client has moved on: the next write goes to the live one.
  EXPECT_THAT(client->Put("/w", "2"), IsOk());

  auto reader = Client({.endpoints = {dead, etcd_->client_url()},
                        .call_timeout = absl::Seconds(5),
                        .connect_timeout = absl::Milliseconds(200)});
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<GetResult> got = reader->Get("/w");  // tried on both
  ASSERT_THAT(got, IsOk());
  ASSERT_THAT(got->kvs, SizeIs(1));
  EXPECT_EQ(got->kvs[0].value, "2");
}

TEST_F(GrpcEtcdTest, WithEtcdDownACallIsUnavailableAndNamesTheEndpoint) {
  StartEtcd();
  auto client = Client({.endpoints = {etcd_->client_url()},
                        .call_timeout = absl::Seconds(1),
                        .connect_timeout = absl::Milliseconds(200)});
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->GrantLease(absl::Seconds(5)), IsOk());
  etcd_->Kill9();
  EXPECT_THAT(client->Get("/x"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(etcd_->client_url())));
  EXPECT_THAT(client->KeepAliveOnce(1), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_THAT(etcd_->Restart(), IsOk());
  EXPECT_THAT(client->Get("/x"), IsOk());
}

// Turns on etcd's authentication with a root user, through etcd's own Auth service (the client
// under test has no user management).
void EnableAuth(const std::string& url, const std::string& password) {
  auto channel = grpc::CreateChannel(url.substr(std::string("http://").size()),
                                     grpc::InsecureChannelCredentials());
  auto auth = etcdserverpb::Auth::NewStub(channel);
  auto call = [](auto method, const auto& request, auto* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.set_wait_for_ready(true);
    return method(&context, request, response);
  };
  etcdserverpb::AuthRoleAddRequest role;
  role.set_name("root");
  etcdserverpb::AuthRoleAddResponse role_response;
  ASSERT_THAT(call([&](auto* c, const auto& r, auto* o) { return auth->RoleAdd(c, r, o); }, role,
                   &role_response),
              IsOk());
  etcdserverpb::AuthUserAddRequest user;
  user.set_name("root");
  user.set_password(password);
  etcdserverpb::AuthUserAddResponse user_response;
  ASSERT_THAT(call([&](auto* c, const auto& r, auto* o) { return auth->UserAdd(c, r, o); }, user,
                   &user_response),
              IsOk());
  etcdserverpb::AuthUserGrantRoleRequest grant;
  grant.set_user("root");
  grant.set_role("root");
  etcdserverpb::AuthUserGrantRoleResponse grant_response;
  ASSERT_THAT(call([&](auto* c, const auto& r, auto* o) { return auth->UserGrantRole(c, r, o); },
                   grant, &grant_response),
              IsOk());
  etcdserverpb::AuthEnableRequest enable;
  etcdserverpb::AuthEnableResponse enable_response;
  ASSERT_THAT(call([&](auto* c, const auto& r, auto* o) { return auth->AuthEnable(c, r, o); },
                   enable, &enable_response),
              IsOk());
}

TEST_F(GrpcEtcdTest, WithAuthOnItAuthenticatesWithItsUserAndPassword) {
  StartEtcd();
  ASSERT_NO_FATAL_FAILURE(EnableAuth(etcd_->client_url(), "s3cret"));
  auto client = Client({.endpoints = {etcd_->client_url()}, .user = "root", .password = "s3cret"});
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Put("/auth", "yes"), IsOk());
  absl::StatusOr<GetResult> got = client->Get("/auth");
  ASSERT_THAT(got, IsOk());
  ASSERT_THAT(got->kvs, SizeIs(1));
  auto anonymous = Client({.endpoints = {etcd_->client_url()}});
  ASSERT_NE(anonymous, nullptr);
  EXPECT_THAT(anonymous->Get("/auth"), ::testing::Not(IsOk()));
  auto wrong = Client({.endpoints = {etcd_->client_url()}, .user = "root", .password = "wrong"});
  ASSERT_NE(wrong, nullptr);
  EXPECT_THAT(wrong->Get("/auth"), ::testing::Not(IsOk()));
}

// The tests start their etcds side by side, each on ports picked free a moment before etcd binds
// them: a port taken in between costs the helper a try on other ports, not the test.
TEST_F(GrpcEtcdTest, AnEtcdWhosePortWasTakenStartsOnOthers) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int taken = ntohs(addr.sin_port);
  int picks = 0;
  absl::StatusOr<std::unique_ptr<testing::EtcdProcess>> etcd = testing::EtcdProcess::StartPicking(
      dir_->path() + "/etcd", {}, absl::Seconds(30),
      [&]() -> absl::StatusOr<int> { return ++picks == 1 ? taken : testing::FreeLoopbackPort(); });
  close(listener);
  ASSERT_THAT(etcd, IsOk());
  EXPECT_EQ(picks, 4);  // the refused try's client and peer ports, then the serving one's
  EXPECT_THAT((*etcd)->client_url(), Not(HasSubstr(absl::StrCat(":", taken))));
  std::unique_ptr<GrpcEtcd> client = Client({.endpoints = {(*etcd)->client_url()}});
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->Put("k", "v"), IsOk());
}

TEST(GrpcEtcdOptionsTest, BadEndpointsAndUnreadableTlsFilesAreRefused) {
  EXPECT_THAT(GrpcEtcd::Create({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GrpcEtcd::Create({.endpoints = {"http://127.0.0.1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("http://127.0.0.1")));
  EXPECT_THAT(
      GrpcEtcd::Create({.endpoints = {"https://127.0.0.1:2379"}, .ca_file = "/nonexistent"}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/nonexistent")));
  EXPECT_THAT(GrpcEtcd::Create({.endpoints = {"https://127.0.0.1:2379"}, .cert_file = "/c"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace jobbroker::cluster
