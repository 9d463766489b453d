// The HTTP server's dashboard API before and after the broker serves: a real HttpServer (civetweb)
// on a free loopback port, read over a socket. The API handler is a stand-in: the real one is
// tested in admin_http_api_test.cc and against the binary in tests/e2e/http_api_test.cc.
#include "server/http/http_server.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/http/http_handler.h"
#include "tests/testing/http_client.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::server {
namespace {

using ::jobbroker::testing::HttpGetResponse;
using ::jobbroker::testing::HttpResponse;
using ::jobbroker::testing::IsOk;
using ::testing::HasSubstr;

class AnswersOk final : public HttpHandler {
 public:
  HttpReply Handle(const HttpRequest& request) const override {
    return HttpReply{.status = 200, .body = absl::StrCat("{\"path\":\"", request.path, "\"}\n")};
  }
};

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = HttpServer::Start("127.0.0.1:0", {});
    ASSERT_THAT(started, IsOk());
    server_ = *std::move(started);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  HttpResponse Get(const std::string& path) {
    auto response = HttpGetResponse(address_, path);
    EXPECT_THAT(response, IsOk());
    return response.ok() ? *response : HttpResponse{};
  }

  std::unique_ptr<HttpServer> server_;
  std::string address_;
};

TEST_F(HttpServerTest, BeforeTheBrokerServesTheApiSaysItIsStarting) {
  HttpResponse r = Get("/api/v1/queues");
  EXPECT_EQ(r.status, 503);
  // Two fields of a JSON object, in either order.
  EXPECT_THAT(r.body, HasSubstr("\"code\":\"UNAVAILABLE\""));
  EXPECT_THAT(r.body,
              HasSubstr("\"message\":\"the broker is starting: its recovery has not finished\""));
}

// The dashboard shows the API's message: while recovering, how far it got, JSON-escaped.
TEST_F(HttpServerTest, WhileStartingTheApiAnswersWithTheRecoverysProgress) {
  std::string progress = "partition 0: 4,259,840 jobs loaded in 5.2 s";
  server_->SetStartingStatus([&progress] { return progress; });
  HttpResponse r = Get("/api/v1/queues");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("\"code\":\"UNAVAILABLE\""));
  EXPECT_THAT(r.body, HasSubstr("\"message\":\"the broker is starting: partition 0: 4,259,840 "
                                "jobs loaded in 5.2 s\""));

  progress = "a \"quoted\" \\ text";  // read at each request
  EXPECT_THAT(Get("/api/v1/queues").body,
              HasSubstr("\"message\":\"the broker is starting: a \\\"quoted\\\" \\\\ text\""));

  AnswersOk api;
  server_->SetApi(&api);
  r = Get("/api/v1/queues");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"path\":\"/api/v1/queues\"}\n");
}

}  // namespace
}  // namespace jobbroker::server
