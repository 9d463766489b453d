// Every malformed or refused request gets its exact status code, a message naming the field, and
// changes nothing (DESIGN.md "Status codes": a refused request changes nothing).

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

namespace v1 = ::jobbroker::v1;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kQueue[] = "bad-input";
constexpr int64_t kMaxPayload = int64_t{1} << 20;  // a queue's default max_payload_bytes

// A broker with one queue holding one ACTIVE job and one READY job, so every refused call has a
// real job and queue to (not) change.
class BadInputTest : public BrokerFixture {
 protected:
  void SetUp() override {
    BrokerFixture::SetUp();
    if (HasFatalFailure()) return;

    active_id_ = client().MustEnqueue(kQueue, "active");
    ready_id_ = client().MustEnqueue(kQueue, "ready");
    std::optional<v1::LeasedJob> job = client().LeaseOne(kQueue, "worker-1", absl::Seconds(10));
    ASSERT_TRUE(job.has_value());
    ASSERT_EQ(job->job_id(), active_id_);
    active_ = *job;
    counts_before_ = client().Counts(kQueue);
    ASSERT_EQ(counts_before_,
              (std::map<std::string, int64_t>{{"JOB_STATE_READY", 1}, {"JOB_STATE_ACTIVE", 1}}));
  }

  // Nothing changed since SetUp: the same counts, the active job still on its first attempt
  // with no checkpoint, the ready job untouched.
  void ExpectNothingChanged() {
    EXPECT_EQ(client().Counts(kQueue), counts_before_);
    v1::Job active = client().MustGetJob(active_id_);
    EXPECT_EQ(active.state(), v1::JOB_STATE_ACTIVE);
    EXPECT_EQ(active.attempt(), 1);
    EXPECT_EQ(active.checkpoint(), "");
    EXPECT_FALSE(active.cancel_requested());
    EXPECT_THAT(active.attempts(), SizeIs(1));
    v1::Job ready = client().MustGetJob(ready_id_);
    EXPECT_EQ(ready.state(), v1::JOB_STATE_READY);
    EXPECT_EQ(ready.attempt(), 0);
  }

  // A queue that must not have been created by a refused call.
  void ExpectNoQueue(const std::string& queue) {
    v1::QueueInfo info;
    EXPECT_THAT(
        client().GetQueue(queue, &info),
        AnyOf(StatusIs(grpc::StatusCode::NOT_FOUND), StatusIs(grpc::StatusCode::INVALID_ARGUMENT)))
        << "queue \"" << queue << "\" exists after a refused request";
  }

  v1::EnqueueRequest ValidEnqueue() const {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload("new");
    return req;
  }

  grpc::Status Enqueue(const v1::EnqueueRequest& req) {
    v1::EnqueueResponse resp;
    return client().Enqueue(req, &resp);
  }

  v1::LeaseRequest ValidLease() const {
    v1::LeaseRequest req;
    req.set_queue(kQueue);
    req.set_worker_id("worker-2");
    return req;
  }

  grpc::Status Lease(const v1::LeaseRequest& req) {
    v1::LeaseResponse resp;
    grpc::Status s = client().Lease(req, &resp);
    if (!s.ok()) {
      EXPECT_THAT(resp.jobs(), SizeIs(0));
    }
    return s;
  }

  // Heartbeat, Ack, Fail and Release with the given ids (the active job's by default).
  grpc::Status Heartbeat(const std::string& job_id, const std::string& lease_id) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id);
    req.set_lease_id(lease_id);
    req.set_checkpoint("must-not-stick");
    v1::HeartbeatResponse resp;
    return client().Heartbeat(req, &resp);
  }
  grpc::Status Ack(const std::string& job_id, const std::string& lease_id) {
    v1::AckRequest req;
    req.set_job_id(job_id);
    req.set_lease_id(lease_id);
    return client().Ack(req);
  }
  grpc::Status Fail(const std::string& job_id, const std::string& lease_id) {
    v1::FailRequest req;
    req.set_job_id(job_id);
    req.set_lease_id(lease_id);
    req.set_error("refused fail");
    v1::FailResponse resp;
    return client().Fail(req, &resp);
  }
  grpc::Status Release(const std::string& job_id, const std::string& lease_id) {
    v1::ReleaseRequest req;
    req.set_job_id(job_id);
    req.set_lease_id(lease_id);
    return client().Release(req);
  }

  std::string active_id_;
  std::string ready_id_;
  v1::LeasedJob active_;
  std::map<std::string, int64_t> counts_before_;
};

auto InvalidArgumentNaming(const std::string& field) {
  return StatusIs(grpc::StatusCode::INVALID_ARGUMENT, HasSubstr(field));
}

TEST_F(BadInputTest, EnqueueWithEmptyQueue) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue("");
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("queue"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithQueueNameOf129Chars) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue(std::string(129, 'q'));
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("queue"));
  ExpectNoQueue(req.queue());
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithQueueNameOf128CharsIsFine) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue(std::string(128, 'q'));
  EXPECT_THAT(Enqueue(req), IsOk());
  EXPECT_EQ(client().Counts(req.queue()), (std::map<std::string, int64_t>{{"JOB_STATE_READY", 1}}));
}

TEST_F(BadInputTest, EnqueueWithSpaceInQueueName) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue("bad queue");
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("queue"));
  ExpectNoQueue(req.queue());
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithBothDelayAndRunAt) {
  v1::EnqueueRequest req = ValidEnqueue();
  *req.mutable_delay() = ToProto(absl::Seconds(5));
  *req.mutable_run_at() = ToProtoTime(absl::Now() + absl::Seconds(5));
  EXPECT_THAT(Enqueue(req), StatusIs(grpc::StatusCode::INVALID_ARGUMENT,
                                     AllOf(HasSubstr("delay"), HasSubstr("run_at"))));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithNegativeDelay) {
  v1::EnqueueRequest req = ValidEnqueue();
  *req.mutable_delay() = ToProto(absl::Seconds(-1));
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("delay"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithNegativeLeaseDuration) {
  v1::EnqueueRequest req = ValidEnqueue();
  *req.mutable_lease_duration() = ToProto(absl::Seconds(-30));
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("lease_duration"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithPayloadOver1MiB) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_payload(std::string(kMaxPayload + 1, 'x'));
  EXPECT_THAT(Enqueue(req),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("max_payload_bytes")));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueBatchWithOneJobOver1MiBNamesIt) {
  v1::EnqueueBatchRequest req;
  *req.add_jobs() = ValidEnqueue();
  *req.add_jobs() = ValidEnqueue();
  req.mutable_jobs(1)->set_payload(std::string(kMaxPayload + 1, 'x'));
  v1::EnqueueBatchResponse resp;
  EXPECT_THAT(client().EnqueueBatch(req, &resp),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("jobs[1].payload")));
  // A batch of one names its job too: the caller sent a list.
  req.mutable_jobs()->DeleteSubrange(0, 1);
  EXPECT_THAT(client().EnqueueBatch(req, &resp),
              StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("jobs[0].payload")));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithPayloadOverTheCeilingOf16MiB) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue("fresh-queue");
  req.set_payload(std::string((16 << 20) + 1, 'x'));
  EXPECT_THAT(Enqueue(req), StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("payload")));
  ExpectNoQueue("fresh-queue");
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithMoreThan64Headers) {
  v1::EnqueueRequest req = ValidEnqueue();
  std::map<std::string, std::string> headers;
  for (int i = 0; i < 65; ++i) headers.emplace(absl::StrCat("h", i), "v");
  req.mutable_headers()->insert(headers.begin(), headers.end());
  EXPECT_THAT(Enqueue(req), StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("headers")));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithHeadersOver64KiB) {
  v1::EnqueueRequest req = ValidEnqueue();
  (*req.mutable_headers())["big"] = std::string(64 << 10, 'v');
  EXPECT_THAT(Enqueue(req), StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, HasSubstr("headers")));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithAnEmptyHeaderName) {
  v1::EnqueueRequest req = ValidEnqueue();
  (*req.mutable_headers())[""] = "v";
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("headers"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, UpdateQueuePolicyWithMaxPayloadBytesOutOfRange) {
  for (int64_t bad : {int64_t{0}, int64_t{-1}, (int64_t{16} << 20) + 1}) {
    v1::UpdateQueuePolicyRequest req;
    req.set_queue(kQueue);
    req.mutable_policy()->set_max_payload_bytes(bad);
    v1::QueueInfo info;
    EXPECT_THAT(client().UpdateQueuePolicy(req, &info), InvalidArgumentNaming("max_payload_bytes"))
        << bad;
  }
  v1::QueueInfo info;
  ASSERT_THAT(client().GetQueue(kQueue, &info), IsOk());
  EXPECT_EQ(info.policy().max_payload_bytes(), kMaxPayload);
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithPayloadOfExactly1MiBIsFine) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_payload(std::string(kMaxPayload, 'x'));
  v1::EnqueueResponse resp;
  ASSERT_THAT(client().Enqueue(req, &resp), IsOk());
  EXPECT_EQ(client().MustGetJob(resp.job_id()).payload().size(), static_cast<size_t>(kMaxPayload));
}

TEST_F(BadInputTest, EnqueueWithDedupKeyHeldForAnotherPayload) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_queue("dedup");
  req.set_dedup_key("key-1");
  req.set_payload("first");
  v1::EnqueueResponse first;
  ASSERT_THAT(client().Enqueue(req, &first), IsOk());
  const std::map<std::string, int64_t> dedup_counts = client().Counts("dedup");

  req.set_payload("second");
  EXPECT_THAT(Enqueue(req), StatusIs(grpc::StatusCode::ALREADY_EXISTS, HasSubstr(first.job_id())));
  EXPECT_EQ(client().Counts("dedup"), dedup_counts);
  EXPECT_EQ(client().MustGetJob(first.job_id()).payload(), "first");
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueBatchWithOneBadJob) {
  v1::EnqueueBatchRequest req;
  *req.add_jobs() = ValidEnqueue();
  *req.add_jobs() = ValidEnqueue();
  req.mutable_jobs(1)->set_queue("no spaces allowed");
  *req.add_jobs() = ValidEnqueue();
  v1::EnqueueBatchResponse resp;
  EXPECT_THAT(client().EnqueueBatch(req, &resp), InvalidArgumentNaming("queue"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithEmptyWorkerId) {
  v1::LeaseRequest req = ValidLease();
  req.set_worker_id("");
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("worker_id"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithEmptyQueue) {
  v1::LeaseRequest req = ValidLease();
  req.set_queue("");
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("queue"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithNegativeLeaseDuration) {
  v1::LeaseRequest req = ValidLease();
  *req.mutable_lease_duration() = ToProto(absl::Seconds(-1));
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("lease_duration"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, HeartbeatWithEmptyIds) {
  EXPECT_THAT(Heartbeat("", active_.lease_id()), InvalidArgumentNaming("job_id"));
  EXPECT_THAT(Heartbeat(active_id_, ""), InvalidArgumentNaming("lease_id"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, AckWithEmptyIds) {
  EXPECT_THAT(Ack("", active_.lease_id()), InvalidArgumentNaming("job_id"));
  EXPECT_THAT(Ack(active_id_, ""), InvalidArgumentNaming("lease_id"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, FailWithEmptyIds) {
  EXPECT_THAT(Fail("", active_.lease_id()), InvalidArgumentNaming("job_id"));
  EXPECT_THAT(Fail(active_id_, ""), InvalidArgumentNaming("lease_id"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, ReleaseWithEmptyIds) {
  EXPECT_THAT(Release("", active_.lease_id()), InvalidArgumentNaming("job_id"));
  EXPECT_THAT(Release(active_id_, ""), InvalidArgumentNaming("lease_id"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, UnknownJobIdIsNotFound) {
  const std::string unknown = absl::StrCat("no-such-job-", active_id_);
  EXPECT_THAT(Heartbeat(unknown, active_.lease_id()), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Ack(unknown, active_.lease_id()), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Fail(unknown, active_.lease_id()), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(Release(unknown, active_.lease_id()), StatusIs(grpc::StatusCode::NOT_FOUND));
  v1::Job job;
  EXPECT_THAT(client().GetJob(unknown, &job), StatusIs(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(client().CancelJob(unknown, &job), StatusIs(grpc::StatusCode::NOT_FOUND));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, WrongLeaseIdIsFailedPrecondition) {
  const std::string wrong = absl::StrCat("not-", active_.lease_id());
  EXPECT_THAT(Heartbeat(active_id_, wrong), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(Ack(active_id_, wrong), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(Fail(active_id_, wrong), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(Release(active_id_, wrong), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseIdOfAnotherJobIsFailedPrecondition) {
  // The ready job was never leased, so the active job's lease cannot be its lease.
  EXPECT_THAT(Ack(ready_id_, active_.lease_id()), StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(Heartbeat(ready_id_, active_.lease_id()),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, UnknownQueueIsNotFoundInAdmin) {
  v1::QueueInfo info;
  EXPECT_THAT(client().GetQueue("never-used", &info), StatusIs(grpc::StatusCode::NOT_FOUND));
  ExpectNothingChanged();
}

// Limits the proto comments state.

TEST_F(BadInputTest, EnqueueWithNegativeMaxAttempts) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_max_attempts(-1);
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("max_attempts"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithDedupKeyOver256Bytes) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_dedup_key(std::string(257, 'k'));
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("dedup_key"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueWithConcurrencyKeyOver256Bytes) {
  v1::EnqueueRequest req = ValidEnqueue();
  req.set_concurrency_key(std::string(257, 'k'));
  EXPECT_THAT(Enqueue(req), InvalidArgumentNaming("concurrency_key"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueBatchEmpty) {
  v1::EnqueueBatchRequest req;
  v1::EnqueueBatchResponse resp;
  EXPECT_THAT(client().EnqueueBatch(req, &resp), InvalidArgumentNaming("jobs"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, EnqueueBatchOver1000Jobs) {
  v1::EnqueueBatchRequest req;
  for (int i = 0; i < 1001; ++i) *req.add_jobs() = ValidEnqueue();
  v1::EnqueueBatchResponse resp;
  EXPECT_THAT(client().EnqueueBatch(req, &resp), InvalidArgumentNaming("jobs"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithMaxJobsOutOfRange) {
  v1::LeaseRequest req = ValidLease();
  req.set_max_jobs(1001);
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("max_jobs"));
  req.set_max_jobs(-1);
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("max_jobs"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithLeaseDurationUnder100ms) {
  v1::LeaseRequest req = ValidLease();
  *req.mutable_lease_duration() = ToProto(absl::Milliseconds(50));
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("lease_duration"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, LeaseWithNegativeWait) {
  v1::LeaseRequest req = ValidLease();
  *req.mutable_wait() = ToProto(absl::Seconds(-1));
  EXPECT_THAT(Lease(req), InvalidArgumentNaming("wait"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, HeartbeatWithNegativeExtendBy) {
  v1::HeartbeatRequest req;
  req.set_job_id(active_id_);
  req.set_lease_id(active_.lease_id());
  *req.mutable_extend_by() = ToProto(absl::Seconds(-5));
  v1::HeartbeatResponse resp;
  EXPECT_THAT(client().Heartbeat(req, &resp), InvalidArgumentNaming("extend_by"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, FailWithNegativeRetryAfter) {
  v1::FailRequest req;
  req.set_job_id(active_id_);
  req.set_lease_id(active_.lease_id());
  *req.mutable_retry_after() = ToProto(absl::Seconds(-5));
  v1::FailResponse resp;
  EXPECT_THAT(client().Fail(req, &resp), InvalidArgumentNaming("retry_after"));
  ExpectNothingChanged();
}

TEST_F(BadInputTest, UpdateQueuePolicyWithZeroMaxAttempts) {
  v1::QueueInfo before;
  ASSERT_THAT(client().GetQueue(kQueue, &before), IsOk());
  v1::UpdateQueuePolicyRequest req;
  req.set_queue(kQueue);
  req.mutable_policy()->mutable_retry()->set_max_attempts(0);
  v1::QueueInfo info;
  EXPECT_THAT(client().UpdateQueuePolicy(req, &info), InvalidArgumentNaming("max_attempts"));
  v1::QueueInfo after;
  ASSERT_THAT(client().GetQueue(kQueue, &after), IsOk());
  EXPECT_EQ(after.policy().SerializeAsString(), before.policy().SerializeAsString());
  ExpectNothingChanged();
}

TEST_F(BadInputTest, UpdateQueuePolicyWithBadQueueName) {
  v1::UpdateQueuePolicyRequest req;
  req.set_queue("bad queue");
  req.mutable_policy()->set_max_concurrency(1);
  v1::QueueInfo info;
  EXPECT_THAT(client().UpdateQueuePolicy(req, &info), InvalidArgumentNaming("queue"));
  ExpectNoQueue(req.queue());
}

}  // namespace
}  // namespace jobbroker::testing
