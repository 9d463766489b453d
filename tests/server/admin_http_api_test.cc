// The dashboard's JSON API (server/http/admin_http_api.cc), called as the HTTP server calls it:
// Handle() with a request struct, no socket. It reaches the real Admin service through the
// in-process channel, as in the binary.
#include "server/http/admin_http_api.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/server/in_process_server.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::server {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::HasSubstr;

class AdminHttpApiTest : public ::testing::Test {
 protected:
  AdminHttpApiTest() : api_(server_.channel()), broker_(server_.NewBrokerStub()) {}

  HttpReply Get(const std::string& path, const std::string& query = "") {
    return api_.Handle(HttpRequest{.method = "GET", .path = path, .query = query});
  }
  HttpReply Post(const std::string& path, const std::string& body = "{}",
                 const std::string& content_type = "application/json") {
    return api_.Handle(
        HttpRequest{.method = "POST", .path = path, .content_type = content_type, .body = body});
  }

  std::string Enqueue(const std::string& queue) {
    grpc::ClientContext ctx;
    InProcessServer::SetDeadline(ctx);
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload("p");
    v1::EnqueueResponse resp;
    EXPECT_THAT(broker_->Enqueue(&ctx, req, &resp), IsOk());
    return resp.job_id();
  }

  template <typename Message>
  Message Parse(const HttpReply& reply) {
    Message m;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(reply.body, &m).ok()) << reply.body;
    return m;
  }

  InProcessServer server_;
  AdminHttpApi api_;
  std::unique_ptr<v1::Broker::Stub> broker_;
};

TEST_F(AdminHttpApiTest, AQueueIsShownWithItsCountsAsJson) {
  Enqueue("emails");
  Enqueue("emails");
  HttpReply reply = Get("/api/v1/queues/emails");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.content_type, "application/json");
  v1::QueueInfo info = Parse<v1::QueueInfo>(reply);
  EXPECT_EQ(info.name(), "emails");
  EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 2);
}

TEST_F(AdminHttpApiTest, AJobIsShownByItsIdAndAnUnknownOneIs404WithTheGrpcCode) {
  const std::string id = Enqueue("emails");
  HttpReply found = Get("/api/v1/jobs/" + id);
  ASSERT_EQ(found.status, 200) << found.body;
  EXPECT_EQ(Parse<v1::Job>(found).state(), v1::JOB_STATE_READY);

  HttpReply missing = Get("/api/v1/jobs/no-such-job");
  EXPECT_EQ(missing.status, 404);
  EXPECT_THAT(missing.body, HasSubstr("\"code\":\"NOT_FOUND\""));
}

TEST_F(AdminHttpApiTest, ListingJobsTakesTheStateFromTheQueryAndRefusesAnUnknownOne) {
  Enqueue("emails");
  HttpReply listed = Get("/api/v1/queues/emails/jobs", "state=JOB_STATE_READY&pageSize=10");
  ASSERT_EQ(listed.status, 200) << listed.body;
  EXPECT_EQ(Parse<v1::ListJobsResponse>(listed).jobs_size(), 1);

  HttpReply bad = Get("/api/v1/queues/emails/jobs", "state=JOB_STATE_NAPPING");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(bad.body, HasSubstr("state"));
}

TEST_F(AdminHttpApiTest, PausingAQueueOverPostPausesIt) {
  Enqueue("emails");
  HttpReply reply = Post("/api/v1/queues/emails/pause");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_TRUE(Parse<v1::QueueInfo>(Get("/api/v1/queues/emails")).policy().paused());
}

TEST_F(AdminHttpApiTest, AChangeWithoutAJsonContentTypeIs415AndChangesNothing) {
  Enqueue("emails");
  HttpReply reply = Post("/api/v1/queues/emails/pause", "", "application/x-www-form-urlencoded");
  EXPECT_EQ(reply.status, 415);
  EXPECT_FALSE(Parse<v1::QueueInfo>(Get("/api/v1/queues/emails")).policy().paused());
}

TEST_F(AdminHttpApiTest, ABodyThatContradictsThePathIsRefused) {
  Enqueue("emails");
  HttpReply reply = Post("/api/v1/queues/emails/pause", R"({"queue":"reports"})");
  EXPECT_EQ(reply.status, 400);
  EXPECT_THAT(reply.body, HasSubstr("contradicts"));
}

TEST_F(AdminHttpApiTest, AWrongMethodIs405WithTheAllowedOnes) {
  HttpReply reply = api_.Handle(HttpRequest{.method = "PUT", .path = "/api/v1/queues"});
  EXPECT_EQ(reply.status, 405);
  EXPECT_EQ(reply.allow, "GET");
}

TEST_F(AdminHttpApiTest, TheClusterIsShownAsJsonAndTakesOnlyGet) {
  HttpReply reply = Get("/api/v1/cluster");
  ASSERT_EQ(reply.status, 200) << reply.body;
  v1::ClusterInfo cluster = Parse<v1::ClusterInfo>(reply);
  // A single node: one partition it leads itself, one replica, no cluster name.
  EXPECT_EQ(cluster.cluster_name(), "");
  EXPECT_EQ(cluster.replication_factor(), 1u);
  ASSERT_EQ(cluster.partitions_size(), static_cast<int>(cluster.partition_count()));
  EXPECT_GE(cluster.partition_count(), 1u);

  HttpReply post = api_.Handle(
      HttpRequest{.method = "POST", .path = "/api/v1/cluster", .content_type = "application/json"});
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.allow, "GET");
}

TEST_F(AdminHttpApiTest, AnUnknownRouteIs404) {
  EXPECT_EQ(Get("/api/v1/nothing-here").status, 404);
  EXPECT_EQ(Get("/api/v2/queues").status, 404);
}

}  // namespace
}  // namespace jobbroker::server
