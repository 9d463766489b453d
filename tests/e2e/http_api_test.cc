// The dashboard's JSON API (/api/v1/ on --http-listen) against the real binary: every route,
// checked through gRPC; bad input refused with a status and a message naming what was wrong,
// changing nothing; bearer tokens and roles as on the Admin service; the dashboard's own files.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "jobbroker/v1/admin.pb.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

constexpr char kJson[] = "Content-Type: application/json";

// The body of `response` parsed as `T`; unknown fields fail, so the JSON is exactly the proto's.
template <typename T>
T Parse(const HttpResponse& response) {
  T message;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(response.body, &message, options);
  EXPECT_TRUE(parsed.ok()) << parsed.message() << " in " << response.body;
  return message;
}

// {"code": ..., "message": ...}
struct ApiError {
  std::string code;
  std::string message;
};

ApiError ParseError(const HttpResponse& response) {
  google::protobuf::Struct error;
  auto parsed = google::protobuf::util::JsonStringToMessage(response.body, &error);
  EXPECT_TRUE(parsed.ok()) << response.body;
  return {error.fields().at("code").string_value(), error.fields().at("message").string_value()};
}

class HttpApiTest : public BrokerFixture {
 protected:
  HttpResponse Get(const std::string& path, std::vector<std::string> headers = {}) {
    absl::StatusOr<HttpResponse> r = HttpSend(process().http_address(), "GET", path, headers);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  }

  HttpResponse Send(const std::string& method, const std::string& path, const std::string& body,
                    std::vector<std::string> headers = {kJson}) {
    absl::StatusOr<HttpResponse> r =
        HttpSend(process().http_address(), method, path, headers, body);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  }

  // A job of `queue` that died on its one attempt with `error`.
  std::string DeadJob(const std::string& queue, const std::string& error) {
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload(R"({"to":"ada@example.com"})");
    req.set_max_attempts(1);
    const std::string id = client().MustEnqueue(req);
    std::vector<v1::LeasedJob> leased = client().MustLease(queue, "worker-7");
    EXPECT_THAT(leased, SizeIs(1));
    v1::FailRequest fail;
    fail.set_job_id(leased.at(0).job_id());
    fail.set_lease_id(leased.at(0).lease_id());
    fail.set_error(error);
    fail.set_permanent(true);
    v1::FailResponse failed;
    EXPECT_THAT(client().Fail(fail, &failed), IsOk());
    EXPECT_EQ(leased.at(0).job_id(), id);
    return id;
  }
};

TEST_F(HttpApiTest, QueuesShowCountsAndTotalsAsTheAdminServiceDoes) {
  client().MustEnqueue("emails", "a");
  client().MustEnqueue("emails", "b");
  client().MustEnqueue("emails", "c");
  client().MustAck(client().MustLease("emails", "w").at(0));
  client().MustEnqueue("reports", "r");

  const HttpResponse list = Get("/api/v1/queues");
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_THAT(list.headers, HasSubstr("Content-Type: application/json"));
  const auto queues = Parse<v1::ListQueuesResponse>(list);
  ASSERT_THAT(queues.queues(), SizeIs(2));
  const v1::QueueInfo& emails = queues.queues(0);
  EXPECT_EQ(emails.name(), "emails");
  EXPECT_EQ(emails.counts().at("JOB_STATE_READY"), 2);
  EXPECT_EQ(emails.counts().at("JOB_STATE_COMPLETED"), 1);
  EXPECT_EQ(emails.enqueued_total(), 3);
  EXPECT_EQ(emails.completed_total(), 1);
  EXPECT_EQ(queues.queues(1).name(), "reports");

  const HttpResponse one = Get("/api/v1/queues/emails");
  ASSERT_EQ(one.status, 200) << one.body;
  v1::QueueInfo via_grpc;
  ASSERT_THAT(client().GetQueue("emails", &via_grpc), IsOk());
  const auto via_http = Parse<v1::QueueInfo>(one);
  EXPECT_EQ(via_http.counts().at("JOB_STATE_READY"), via_grpc.counts().at("JOB_STATE_READY"));
  EXPECT_EQ(via_http.policy().retry().max_attempts(), via_grpc.policy().retry().max_attempts());
  // Zeros are printed, not left out: the dashboard reads "active": "0".
  EXPECT_THAT(one.body, HasSubstr(R"("active":"0")"));
}

TEST_F(HttpApiTest, JobListsPageByStateAndFindADedupKey) {
  const std::string dead = DeadJob("q", "boom");  // first: DeadJob leases the queue's oldest
  std::vector<std::string> ready;
  for (int i = 0; i < 5; ++i) ready.push_back(client().MustEnqueue("q", absl::StrCat("job-", i)));
  v1::EnqueueRequest keyed;
  keyed.set_queue("q");
  keyed.set_payload("keyed");
  keyed.set_dedup_key("order 7/ü");  // spaces, a slash and UTF-8 travel percent-encoded
  const std::string keyed_id = client().MustEnqueue(keyed);

  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    const HttpResponse page = Get(absl::StrCat("/api/v1/queues/q/jobs?state=JOB_STATE_READY",
                                               "&pageSize=2&pageToken=", UrlEncode(token)));
    ASSERT_EQ(page.status, 200) << page.body;
    const auto jobs = Parse<v1::ListJobsResponse>(page);
    EXPECT_LE(jobs.jobs_size(), 2);
    for (const v1::Job& j : jobs.jobs()) seen.push_back(j.id());
    token = jobs.next_page_token();
    ASSERT_LT(++pages, 10);
  } while (!token.empty());
  std::vector<std::string> want = ready;
  want.push_back(keyed_id);
  EXPECT_EQ(seen, want);
  EXPECT_EQ(pages, 3);

  const auto newest =
      Parse<v1::ListJobsResponse>(Get("/api/v1/queues/q/jobs?newestFirst=true&pageSize=1"));
  ASSERT_THAT(newest.jobs(), SizeIs(1));
  EXPECT_EQ(newest.jobs(0).id(), keyed_id);
  const auto dead_only =
      Parse<v1::ListJobsResponse>(Get("/api/v1/queues/q/jobs?state=JOB_STATE_FAILED"));
  ASSERT_THAT(dead_only.jobs(), SizeIs(1));
  EXPECT_EQ(dead_only.jobs(0).id(), dead);

  const auto by_key = Parse<v1::ListJobsResponse>(
      Get(absl::StrCat("/api/v1/queues/q/jobs?dedupKey=", UrlEncode("order 7/ü"))));
  ASSERT_THAT(by_key.jobs(), SizeIs(1));
  EXPECT_EQ(by_key.jobs(0).id(), keyed_id);
  EXPECT_EQ(by_key.jobs(0).dedup_key(), "order 7/ü");
  EXPECT_THAT(Parse<v1::ListJobsResponse>(Get("/api/v1/queues/q/jobs?dedupKey=order-8")).jobs(),
              SizeIs(0));
}

TEST_F(HttpApiTest, ADeadJobShowsItsErrorAndRetryMakesItReady) {
  const std::string id = DeadJob("emails", "smtp 550: mailbox unavailable");

  const HttpResponse shown = Get("/api/v1/jobs/" + id);
  ASSERT_EQ(shown.status, 200) << shown.body;
  const auto job = Parse<v1::Job>(shown);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.last_error(), "smtp 550: mailbox unavailable");
  EXPECT_EQ(job.fail_reason(), v1::FAIL_REASON_PERMANENT);
  ASSERT_THAT(job.attempts(), SizeIs(1));
  EXPECT_EQ(job.attempts(0).worker_id(), "worker-7");
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PERMANENT_ERROR);
  EXPECT_EQ(job.payload(), R"({"to":"ada@example.com"})");

  const HttpResponse retried = Send("POST", "/api/v1/jobs/" + id + "/retry", "{}");
  ASSERT_EQ(retried.status, 200) << retried.body;
  const auto answer = Parse<v1::RetryJobResponse>(retried);
  EXPECT_EQ(answer.retried(), 1);
  EXPECT_EQ(answer.job().state(), v1::JOB_STATE_READY);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY) << "through gRPC";

  // A second retry is refused: the job is not dead any more.
  const HttpResponse again = Send("POST", "/api/v1/jobs/" + id + "/retry", "");
  EXPECT_EQ(again.status, 400);
  EXPECT_EQ(ParseError(again).code, "FAILED_PRECONDITION");
}

TEST_F(HttpApiTest, CancelAndDeleteAJob) {
  const std::string id = client().MustEnqueue("q", "x");
  const HttpResponse cancelled = Send("POST", "/api/v1/jobs/" + id + "/cancel", "{}");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_EQ(Parse<v1::Job>(cancelled).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_CANCELLED);

  const HttpResponse deleted = Send("DELETE", "/api/v1/jobs/" + id, "");
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  v1::Job gone;
  EXPECT_THAT(client().GetJob(id, &gone), StatusIs(grpc::StatusCode::NOT_FOUND));
  const HttpResponse missing = Get("/api/v1/jobs/" + id);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(ParseError(missing).code, "NOT_FOUND");
  EXPECT_THAT(ParseError(missing).message, HasSubstr(id));
}

TEST_F(HttpApiTest, PutListTriggerAndDeleteASchedule) {
  const HttpResponse put = Send("POST", "/api/v1/schedules/nightly",
                                R"({"cron":"30 2 * * *","timeZone":"Europe/Berlin",)"
                                R"("template":{"queue":"reports","payload":"e30="}})");
  ASSERT_EQ(put.status, 200) << put.body;
  const v1::Schedule schedule = Parse<v1::Schedule>(put);
  EXPECT_EQ(schedule.schedule_id(), "nightly") << "named by the path";
  EXPECT_TRUE(schedule.has_next_run_at());

  const v1::ListSchedulesResponse list = Parse<v1::ListSchedulesResponse>(Get("/api/v1/schedules"));
  ASSERT_EQ(list.schedules_size(), 1);
  EXPECT_EQ(list.schedules(0).time_zone(), "Europe/Berlin");
  EXPECT_EQ(Parse<v1::Schedule>(Get("/api/v1/schedules/nightly")).cron(), "30 2 * * *");

  const HttpResponse run = Send("POST", "/api/v1/schedules/nightly/trigger", "{}");
  ASSERT_EQ(run.status, 200) << run.body;
  const std::string job_id = Parse<v1::TriggerScheduleResponse>(run).job_id();
  EXPECT_EQ(client().MustGetJob(job_id).payload(), "{}");

  const HttpResponse contradicting =
      Send("POST", "/api/v1/schedules/nightly", R"({"scheduleId":"other","every":"60s"})");
  EXPECT_EQ(contradicting.status, 400);
  EXPECT_THAT(ParseError(contradicting).message, HasSubstr("scheduleId"));
  const HttpResponse bad = Send("POST", "/api/v1/schedules/nightly",
                                R"({"every":"0.5s","template":{"queue":"reports"}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(ParseError(bad).message, ::testing::StartsWith("schedule.every"));

  ASSERT_EQ(Send("DELETE", "/api/v1/schedules/nightly", "").status, 200);
  EXPECT_EQ(Get("/api/v1/schedules/nightly").status, 404);
}

TEST_F(HttpApiTest, PauseResumeRedriveAndPurgeAQueue) {
  DeadJob("q", "e1");
  DeadJob("q", "e2");
  client().MustEnqueue("q", "x");

  const HttpResponse paused = Send("POST", "/api/v1/queues/q/pause", "");
  ASSERT_EQ(paused.status, 200) << paused.body;
  EXPECT_TRUE(Parse<v1::QueueInfo>(paused).policy().paused());
  v1::QueueInfo info;
  ASSERT_THAT(client().GetQueue("q", &info), IsOk());
  EXPECT_TRUE(info.policy().paused()) << "through gRPC";
  EXPECT_THAT(client().MustLease("q", "w"), SizeIs(0)) << "a paused queue leases nothing";

  ASSERT_EQ(Send("POST", "/api/v1/queues/q/resume", "{}").status, 200);
  ASSERT_THAT(client().GetQueue("q", &info), IsOk());
  EXPECT_FALSE(info.policy().paused());

  const HttpResponse dry =
      Send("POST", "/api/v1/queues/q/retry", R"({"state":"JOB_STATE_FAILED","dryRun":true})");
  ASSERT_EQ(dry.status, 200) << dry.body;
  EXPECT_EQ(Parse<v1::RetryJobResponse>(dry).matched(), 2);
  EXPECT_EQ(Parse<v1::RetryJobResponse>(dry).retried(), 0);
  EXPECT_EQ(client().Counts("q")["JOB_STATE_FAILED"], 2) << "a dry run changes nothing";
  const HttpResponse redriven = Send("POST", "/api/v1/queues/q/retry", "{}");
  ASSERT_EQ(redriven.status, 200) << redriven.body;
  EXPECT_EQ(Parse<v1::RetryJobResponse>(redriven).retried(), 2);
  EXPECT_EQ(client().Counts("q")["JOB_STATE_READY"], 3);

  const HttpResponse policy =
      Send("POST", "/api/v1/queues/q/policy", R"({"policy":{"maxConcurrency":4}})");
  ASSERT_EQ(policy.status, 200) << policy.body;
  ASSERT_THAT(client().GetQueue("q", &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 4);

  const HttpResponse purged =
      Send("POST", "/api/v1/queues/q/purge", R"({"states":["JOB_STATE_READY"]})");
  ASSERT_EQ(purged.status, 200) << purged.body;
  EXPECT_EQ(Parse<v1::PurgeQueueResponse>(purged).purged(), 3);
  EXPECT_EQ(client().Counts("q")["JOB_STATE_READY"], 0);
}

TEST_F(HttpApiTest, BadRequestsNameWhatIsWrongAndChangeNothing) {
  const std::string id = client().MustEnqueue("q", "x");
  struct Case {
    std::string method, path, body;
    std::vector<std::string> headers;
    int status;
    std::string code, says;
  };
  const std::vector<Case> cases = {
      // A change without a JSON content type, as a cross-site form would send it.
      {"POST",
       "/api/v1/queues/q/pause",
       "",
       {"Content-Type: text/plain"},
       415,
       "INVALID_ARGUMENT",
       "Content-Type"},
      {"POST", "/api/v1/queues/q/pause", "", {}, 415, "INVALID_ARGUMENT", "application/json"},
      {"POST",
       "/api/v1/queues/q/policy",
       R"({"policy":{"maxConcurency":4}})",
       {kJson},
       400,
       "INVALID_ARGUMENT",
       "maxConcurency"},
      {"POST", "/api/v1/queues/q/policy", "{not json", {kJson}, 400, "INVALID_ARGUMENT", "body"},
      {"POST",
       "/api/v1/queues/q/retry",
       R"({"queue":"other"})",
       {kJson},
       400,
       "INVALID_ARGUMENT",
       "contradicts"},
      {"POST",
       "/api/v1/queues/q/retry",
       R"({"limit":-1})",
       {kJson},
       400,
       "INVALID_ARGUMENT",
       "limit"},
      {"POST",
       "/api/v1/queues/q/purge",
       R"({"states":["JOB_STATE_ACTIVE"]})",
       {kJson},
       400,
       "INVALID_ARGUMENT",
       "ACTIVE"},
      {"POST", "/api/v1/jobs/" + id + "/retry", "{}", {kJson}, 400, "FAILED_PRECONDITION", id},
      {"GET", "/api/v1/queues/q/jobs?state=DONE", "", {}, 400, "INVALID_ARGUMENT", "state"},
      {"GET", "/api/v1/queues/q/jobs?pageSize=ten", "", {}, 400, "INVALID_ARGUMENT", "pageSize"},
      {"GET", "/api/v1/queues/q/jobs?pageSize=5000", "", {}, 400, "INVALID_ARGUMENT", "page_size"},
      {"GET", "/api/v1/queues/q/jobs?sort=age", "", {}, 400, "INVALID_ARGUMENT", "sort"},
      {"GET", "/api/v1/queues/bad%20name", "", {}, 400, "INVALID_ARGUMENT", "queue"},
      {"GET", "/api/v1/queues/nope", "", {}, 404, "NOT_FOUND", "nope"},
      {"GET", "/api/v1/jobs/01JD3Q0000000000000000000X", "", {}, 404, "NOT_FOUND", "01JD3Q"},
      {"GET", "/api/v1/nothing", "", {}, 404, "NOT_FOUND", "no route"},
      {"PUT", "/api/v1/jobs/" + id, "{}", {kJson}, 405, "UNIMPLEMENTED", "GET, DELETE"},
      {"GET", "/api/v1/queues/q/pause", "", {}, 405, "UNIMPLEMENTED", "POST"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.method, " ", c.path, " ", c.body));
    const HttpResponse r = Send(c.method, c.path, c.body, c.headers);
    EXPECT_EQ(r.status, c.status) << r.body;
    const ApiError error = ParseError(r);
    EXPECT_EQ(error.code, c.code);
    EXPECT_THAT(error.message, HasSubstr(c.says));
    if (c.status == 405) {
      EXPECT_THAT(r.headers, HasSubstr("Allow: "));
    }
  }

  // A body over 1 MiB is refused before it is parsed.
  const HttpResponse huge = Send(
      "POST", "/api/v1/queues/q/policy",
      absl::StrCat(R"({"policy":{"maxConcurrency":4},"x":")", std::string(1 << 20, 'a'), R"("})"));
  EXPECT_EQ(huge.status, 413);
  EXPECT_THAT(ParseError(huge).message, HasSubstr("body: over 1048576 bytes"));

  v1::QueueInfo info;
  ASSERT_THAT(client().GetQueue("q", &info), IsOk());
  EXPECT_FALSE(info.policy().paused());
  EXPECT_EQ(info.policy().max_concurrency(), 0);
  EXPECT_EQ(client().MustGetJob(id).state(), v1::JOB_STATE_READY);
  EXPECT_EQ(client().Counts("q")["JOB_STATE_READY"], 1);
}

TEST_F(HttpApiTest, TokensAndRolesAreTheAdminServices) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::string> tokens = (*dir)->WriteFile("tokens.json", R"({"tokens": [
    {"name": "ops", "roles": ["admin"], "queues": ["*"], "token": "jb-ops-1"},
    {"name": "billing-ops", "roles": ["admin"], "queues": ["billing"], "token": "jb-bill-2"},
    {"name": "worker", "roles": ["worker"], "queues": ["*"], "token": "jb-work-3"}]})");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_NO_FATAL_FAILURE(Start({.extra_args = {"--auth-tokens", *tokens}}));
  // Queues come into being through a policy change, which an admin may make.
  for (const char* queue : {"billing", "emails"}) {
    const HttpResponse made = Send("POST", absl::StrCat("/api/v1/queues/", queue, "/policy"), "{}",
                                   {kJson, "Authorization: Bearer jb-ops-1"});
    ASSERT_EQ(made.status, 200) << made.body;
  }

  const HttpResponse anonymous = Get("/api/v1/queues");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(ParseError(anonymous).code, "UNAUTHENTICATED");
  const HttpResponse wrong = Get("/api/v1/queues", {"Authorization: Bearer jb-nobody"});
  EXPECT_EQ(wrong.status, 401);
  const HttpResponse worker = Get("/api/v1/queues/emails", {"Authorization: Bearer jb-work-3"});
  EXPECT_EQ(worker.status, 403);
  EXPECT_EQ(ParseError(worker).code, "PERMISSION_DENIED");
  const HttpResponse pause_elsewhere =
      Send("POST", "/api/v1/queues/emails/pause", "{}", {kJson, "Authorization: Bearer jb-bill-2"});
  EXPECT_EQ(pause_elsewhere.status, 403);

  const auto all =
      Parse<v1::ListQueuesResponse>(Get("/api/v1/queues", {"Authorization: Bearer jb-ops-1"}));
  const auto scoped =
      Parse<v1::ListQueuesResponse>(Get("/api/v1/queues", {"Authorization: Bearer jb-bill-2"}));
  ASSERT_THAT(all.queues(), SizeIs(2));
  ASSERT_THAT(scoped.queues(), SizeIs(1));
  EXPECT_EQ(scoped.queues(0).name(), "billing");

  // The dashboard's files are public (they hold no data); the probes stay open too.
  EXPECT_EQ(Get("/").status, 200);
  EXPECT_EQ(Get("/healthz").status, 200);
}

TEST_F(HttpApiTest, TheDashboardIsServedFromTheBinary) {
  const HttpResponse index = Get("/");
  ASSERT_EQ(index.status, 200);
  EXPECT_THAT(index.headers, HasSubstr("Content-Type: text/html; charset=utf-8"));
  EXPECT_THAT(index.headers, HasSubstr("Content-Security-Policy: default-src 'self'"));
  EXPECT_THAT(index.headers, HasSubstr("X-Content-Type-Options: nosniff"));
  EXPECT_THAT(index.body, HasSubstr("<!doctype html>"));
  EXPECT_EQ(Get("/index.html").body, index.body);
  const HttpResponse script = Get("/app.js");
  ASSERT_EQ(script.status, 200);
  EXPECT_THAT(script.headers, HasSubstr("Content-Type: text/javascript"));

  EXPECT_EQ(Get("/no-such-file.js").status, 404);
  // Only /api/ is the API's: a file whose name starts with "api" is the dashboard's.
  EXPECT_THAT(Get("/api.js").headers, HasSubstr("Content-Type: text/plain"));
  EXPECT_EQ(Get("/app.js/x").status, 404);
  EXPECT_EQ(Get("/../CMakeLists.txt").status, 404);
  EXPECT_EQ(Send("POST", "/", "{}").status, 405);
  // The older endpoints keep their own handlers.
  EXPECT_THAT(Get("/metrics").body, HasSubstr("# TYPE"));
  EXPECT_EQ(Get("/readyz").body, "ready\n");
}

}  // namespace
}  // namespace jobbroker::testing
