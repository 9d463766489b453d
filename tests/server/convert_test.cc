// The wire <-> core conversions (server/convert/): what each copies, and that input only the wire
// form can get wrong is refused with INVALID_ARGUMENT naming the field.
#include "server/convert/convert.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::server {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
const absl::Time kT = absl::FromUnixSeconds(1'800'000'000) + absl::Milliseconds(250);

google::protobuf::Duration Dur(int64_t seconds, int32_t nanos) {
  google::protobuf::Duration d;
  d.set_seconds(seconds);
  d.set_nanos(nanos);
  return d;
}

TEST(DurationFromProtoTest, AWellFormedDurationBecomesItsValue) {
  EXPECT_EQ(*FromProto(Dur(1, 500'000'000), "wait"), absl::Milliseconds(1500));
  EXPECT_EQ(*FromProto(Dur(-1, -500'000'000), "wait"), absl::Milliseconds(-1500));
}

TEST(DurationFromProtoTest, NanosOutOfRangeOrOfTheWrongSignAreRefusedNamingTheField) {
  EXPECT_THAT(FromProto(Dur(0, 1'000'000'000), "wait"),
              StatusIs(kInvalid, StartsWith("wait is not a valid duration")));
  EXPECT_THAT(FromProto(Dur(1, -1), "extend_by"),
              StatusIs(kInvalid, StartsWith("extend_by is not a valid duration")));
  EXPECT_THAT(FromProto(Dur(-1, 1), "delay"), StatusIs(kInvalid, StartsWith("delay")));
}

TEST(DurationFromProtoTest, SecondsBeyondTenThousandYearsAreRefused) {
  EXPECT_THAT(FromProto(Dur(400'000'000'000, 0), "dedup_ttl"),
              StatusIs(kInvalid, StartsWith("dedup_ttl is out of range")));
}

TEST(TimestampFromProtoTest, AValidTimestampRoundTripsAndABadOneNamesTheField) {
  google::protobuf::Timestamp t;
  ToProto(kT, &t);
  EXPECT_EQ(*FromProto(t, "run_at"), kT);
  t.set_nanos(-1);
  EXPECT_THAT(FromProto(t, "run_at"), StatusIs(kInvalid, StartsWith("run_at is not a valid")));
  t.set_nanos(0);
  t.set_seconds(-70'000'000'000);
  EXPECT_THAT(FromProto(t, "run_at"), StatusIs(kInvalid, StartsWith("run_at is out of range")));
}

TEST(TimeToProtoTest, AnInfiniteTimeLeavesTheTimestampUnset) {
  google::protobuf::Timestamp t;
  ToProto(absl::InfiniteFuture(), &t);
  ToProto(absl::InfinitePast(), &t);
  EXPECT_EQ(t.seconds(), 0);
  EXPECT_EQ(t.nanos(), 0);
  EXPECT_FALSE(HasTime(absl::InfiniteFuture()));
  EXPECT_TRUE(HasTime(kT));
}

TEST(EnqueueFromProtoTest, CopiesEveryField) {
  v1::EnqueueRequest req;
  req.set_queue("emails");
  req.set_payload("p");
  (*req.mutable_headers())["trace"] = "t1";
  req.set_priority(7);
  *req.mutable_delay() = Dur(5, 0);
  req.set_dedup_key("k");
  *req.mutable_dedup_ttl() = Dur(60, 0);
  req.set_max_attempts(3);
  *req.mutable_lease_duration() = Dur(10, 0);
  req.set_concurrency_key("tenant");
  *req.mutable_timeout() = Dur(90, 0);
  ToProto(kT, req.mutable_expire_at());
  absl::StatusOr<core::EnqueueSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->queue, "emails");
  EXPECT_EQ(spec->payload, "p");
  EXPECT_THAT(spec->headers, ElementsAre(Pair("trace", "t1")));
  EXPECT_EQ(spec->priority, 7);
  EXPECT_EQ(spec->delay, absl::Seconds(5));
  EXPECT_EQ(spec->dedup_key, "k");
  EXPECT_EQ(spec->dedup_ttl, absl::Seconds(60));
  EXPECT_EQ(spec->max_attempts, 3);
  EXPECT_EQ(spec->lease_duration, absl::Seconds(10));
  EXPECT_EQ(spec->concurrency_key, "tenant");
  EXPECT_EQ(spec->timeout, absl::Seconds(90));
  EXPECT_EQ(spec->expire_at, kT);
}

TEST(ReleaseFromProtoTest, ADelayIsASnoozeAndABadOneIsNamed) {
  v1::ReleaseRequest req;
  req.set_job_id("j");
  req.set_lease_id("l");
  EXPECT_FALSE(FromProto(req)->delay.has_value());
  *req.mutable_delay() = Dur(30, 0);
  EXPECT_EQ(FromProto(req)->delay, absl::Seconds(30));
  *req.mutable_delay() = Dur(1, -1);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("delay")));
}

TEST(EnqueueFromProtoTest, DelayAndRunAtTogetherAreRefused) {
  v1::EnqueueRequest req;
  req.set_queue("q");
  *req.mutable_delay() = Dur(1, 0);
  ToProto(kT, req.mutable_run_at());
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, HasSubstr("delay and run_at are exclusive")));
}

TEST(EnqueueFromProtoTest, AMalformedDurationNamesItsField) {
  v1::EnqueueRequest req;
  *req.mutable_dedup_ttl() = Dur(0, -2'000'000'000);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("dedup_ttl")));
  req.clear_dedup_ttl();
  *req.mutable_lease_duration() = Dur(1, -1);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("lease_duration")));
}

TEST(LeaseFromProtoTest, CopiesTheFieldsAndNamesABadLeaseDuration) {
  v1::LeaseRequest req;
  req.set_queue("q");
  req.set_worker_id("w");
  req.set_max_jobs(4);
  *req.mutable_lease_duration() = Dur(20, 0);
  absl::StatusOr<core::LeaseSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->queue, "q");
  EXPECT_EQ(spec->worker_id, "w");
  EXPECT_EQ(spec->max_jobs, 4);
  EXPECT_EQ(spec->lease_duration, absl::Seconds(20));
  *req.mutable_lease_duration() = Dur(0, 2'000'000'000);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("lease_duration")));
}

TEST(HeartbeatFromProtoTest, ACheckpointIsSetOnlyWhenSentAndABadExtendByIsNamed) {
  v1::HeartbeatRequest req;
  req.set_job_id("j");
  req.set_lease_id("l");
  absl::StatusOr<core::HeartbeatSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->job_id, "j");
  EXPECT_EQ(spec->lease_id, "l");
  EXPECT_FALSE(spec->checkpoint.has_value());
  req.set_checkpoint("");
  EXPECT_EQ(FromProto(req)->checkpoint, "") << "an empty checkpoint is still a checkpoint";
  *req.mutable_extend_by() = Dur(1, -1);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("extend_by")));
}

TEST(AckFromProtoTest, AnAckBatchIsEachAckInOrder) {
  v1::AckBatchRequest req;
  for (const char* id : {"a", "b"}) {
    v1::AckRequest* ack = req.add_acks();
    ack->set_job_id(id);
    ack->set_lease_id(std::string("lease-") + id);
    ack->set_result("done");
  }
  std::vector<core::AckSpec> specs = FromProto(req);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[1].job_id, "b");
  EXPECT_EQ(specs[1].lease_id, "lease-b");
  EXPECT_EQ(specs[1].result, "done");
}

TEST(FailFromProtoTest, RetryAfterIsOptionalAndABadOneIsNamed) {
  v1::FailRequest req;
  req.set_job_id("j");
  req.set_error("boom");
  req.set_permanent(true);
  absl::StatusOr<core::FailSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->error, "boom");
  EXPECT_TRUE(spec->permanent);
  EXPECT_FALSE(spec->retry_after.has_value());
  *req.mutable_retry_after() = Dur(30, 0);
  EXPECT_EQ(FromProto(req)->retry_after, absl::Seconds(30));
  *req.mutable_retry_after() = Dur(-1, 1);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("retry_after")));
}

TEST(SubscribeFromProtoTest, CopiesTheFieldsAndNamesABadLeaseDuration) {
  v1::SubscribeRequest req;
  req.add_queues("a");
  req.add_queues("b");
  req.set_worker_id("w");
  req.set_max_in_flight(8);
  absl::StatusOr<core::SubscribeSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(spec->queues, ElementsAre("a", "b"));
  EXPECT_EQ(spec->worker_id, "w");
  EXPECT_EQ(spec->max_in_flight, 8);
  EXPECT_EQ(spec->lease_duration, absl::ZeroDuration()) << "unset: the job's or the queue's";
  *req.mutable_lease_duration() = Dur(0, -2'000'000'000);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("lease_duration")));
}

TEST(ListJobsFromProtoTest, AnUnsetStateListsEveryStateAndAnUnknownOneIsRefused) {
  v1::ListJobsRequest req;
  req.set_queue("q");
  req.set_page_size(10);
  EXPECT_FALSE(FromProto(req)->state.has_value());
  req.set_state(v1::JOB_STATE_FAILED);
  EXPECT_EQ(FromProto(req)->state, core::JobState::kFailed);
  req.set_state(static_cast<v1::JobState>(99));
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("state is not a known JobState")));
}

TEST(RetryJobFromProtoTest, TheBulkFormCarriesQueueStateDryRunAndLimit) {
  v1::RetryJobRequest req;
  req.set_queue("q");
  req.set_state(v1::JOB_STATE_CANCELLED);
  req.set_dry_run(true);
  req.set_limit(5);
  absl::StatusOr<core::RetryJobsSpec> spec = FromProto(req);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->queue, "q");
  EXPECT_EQ(spec->state, core::JobState::kCancelled);
  EXPECT_TRUE(spec->dry_run);
  EXPECT_EQ(spec->limit, 5);
  req.set_state(static_cast<v1::JobState>(-3));
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("state")));
}

TEST(PurgeQueueFromProtoTest, AnUnknownStateIsRefusedByItsIndex) {
  v1::PurgeQueueRequest req;
  req.add_states(v1::JOB_STATE_COMPLETED);
  EXPECT_THAT(*FromProto(req), ElementsAre(core::JobState::kCompleted));
  req.add_states(v1::JOB_STATE_UNSPECIFIED);
  EXPECT_THAT(FromProto(req), StatusIs(kInvalid, StartsWith("states[1] is not a known JobState")));
}

TEST(QueuePolicyFromProtoTest, SetFieldsOverrideAndTheRestStayUnset) {
  v1::QueuePolicy p;
  p.set_max_concurrency(3);
  *p.mutable_retry()->mutable_initial_backoff() = Dur(2, 0);
  p.mutable_retry()->set_jitter(v1::JITTER_EQUAL);
  absl::StatusOr<core::PolicyOverride> o = FromProto(p, "policy");
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->max_concurrency, 3);
  EXPECT_EQ(o->initial_backoff, absl::Seconds(2));
  EXPECT_EQ(o->jitter, core::Jitter::kEqual);
  EXPECT_FALSE(o->lease_duration.has_value());
  EXPECT_FALSE(o->timeout.has_value());
  EXPECT_FALSE(o->max_snoozes.has_value());
  *p.mutable_timeout() = Dur(300, 0);
  p.set_max_snoozes(4);
  o = FromProto(p, "policy");
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->timeout, absl::Minutes(5));
  EXPECT_EQ(o->max_snoozes, 4);
}

TEST(QueuePolicyFromProtoTest, ErrorsNameTheFieldUnderTheGivenPrefix) {
  v1::QueuePolicy p;
  p.mutable_retry()->set_jitter(static_cast<v1::Jitter>(42));
  EXPECT_THAT(FromProto(p, "queues[\"q\"]"),
              StatusIs(kInvalid, StartsWith("queues[\"q\"].retry.jitter is not a known Jitter")));
  p.mutable_retry()->clear_jitter();
  *p.mutable_failed_retention()->mutable_max_age() = Dur(1, -1);
  EXPECT_THAT(FromProto(p, "default_policy"),
              StatusIs(kInvalid, StartsWith("default_policy.failed_retention.max_age")));
}

TEST(ResultToProtoTest, AnEnqueueResultCarriesTheIdAndWhetherItWasDeduplicated) {
  v1::EnqueueResponse out;
  ToProto(core::EnqueueResult{.job_id = "j1", .deduplicated = true}, &out);
  EXPECT_EQ(out.job_id(), "j1");
  EXPECT_TRUE(out.deduplicated());
}

TEST(ResultToProtoTest, ALeasedJobCarriesEveryFieldAndNoInfiniteTimes) {
  core::LeasedJob j{.job_id = "j",
                    .lease_id = "l",
                    .queue = "q",
                    .payload = "p",
                    .headers = {{"h", "v"}},
                    .attempt = 2,
                    .max_attempts = 5,
                    .lease_deadline = kT,
                    .idempotency_key = "ik",
                    .checkpoint = "c",
                    .enqueued_at = absl::InfinitePast(),
                    .timeout_at = kT + absl::Seconds(1)};
  v1::LeasedJob out;
  ToProto(j, &out);
  EXPECT_EQ(out.job_id(), "j");
  EXPECT_EQ(out.lease_id(), "l");
  EXPECT_EQ(out.queue(), "q");
  EXPECT_EQ(out.payload(), "p");
  EXPECT_THAT(out.headers(), ElementsAre(Pair("h", "v")));
  EXPECT_EQ(out.attempt(), 2);
  EXPECT_EQ(out.max_attempts(), 5);
  EXPECT_EQ(*FromProto(out.lease_deadline(), "lease_deadline"), kT);
  EXPECT_EQ(out.idempotency_key(), "ik");
  EXPECT_EQ(out.checkpoint(), "c");
  EXPECT_FALSE(out.has_enqueued_at());
  EXPECT_EQ(*FromProto(out.timeout_at(), "timeout_at"), kT + absl::Seconds(1));
  j.timeout_at = absl::InfiniteFuture();
  out.Clear();
  ToProto(j, &out);
  EXPECT_FALSE(out.has_timeout_at()) << "no limit, no timeout_at";
}

TEST(ResultToProtoTest, AHeartbeatResultReadsTheSameInTheUnaryReplyAndOnAStream) {
  const core::HeartbeatResult r{.lease_deadline = kT, .cancel_requested = true};
  v1::HeartbeatResponse unary;
  ToProto(r, &unary);
  v1::WorkResult stream;
  ToProto(r, &stream);
  EXPECT_EQ(*FromProto(unary.lease_deadline(), "lease_deadline"), kT);
  EXPECT_EQ(*FromProto(stream.lease_deadline(), "lease_deadline"), kT);
  EXPECT_TRUE(unary.cancel_requested());
  EXPECT_TRUE(stream.cancel_requested());
}

TEST(ResultToProtoTest, AFailResultGivesTheNextAttemptOnlyWhenOneIsScheduled) {
  v1::FailResponse scheduled;
  ToProto(core::FailResult{.state = core::JobState::kScheduled, .next_attempt_at = kT}, &scheduled);
  EXPECT_EQ(scheduled.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(*FromProto(scheduled.next_attempt_at(), "next_attempt_at"), kT);
  v1::FailResponse dead;
  ToProto(core::FailResult{.state = core::JobState::kFailed}, &dead);
  EXPECT_EQ(dead.state(), v1::JOB_STATE_FAILED);
  EXPECT_FALSE(dead.has_next_attempt_at());
}

TEST(ResultToProtoTest, AWorkResultEchoesTheRequestIdWithTheCodeAndMessage) {
  v1::WorkResult out;
  ToProto(17, absl::FailedPreconditionError("stale lease"), &out);
  EXPECT_EQ(out.request_id(), 17u);
  EXPECT_EQ(out.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(out.message(), "stale lease");
}

TEST(ResultToProtoTest, AnAckBatchResultListsOnlyTheRefusedItemsByIndex) {
  v1::WorkResult out;
  ToProto({absl::OkStatus(), absl::NotFoundError("no job b"), absl::OkStatus()}, &out);
  ASSERT_EQ(out.item_errors_size(), 1);
  EXPECT_EQ(out.item_errors(0).index(), 1);
  EXPECT_EQ(out.item_errors(0).code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(out.item_errors(0).message(), "no job b");
}

TEST(ResultToProtoTest, AListJobsPageCarriesItsJobsAndTheNextPageToken) {
  core::ListJobsResult page;
  page.jobs.resize(2);
  page.jobs[0].id = "a";
  page.jobs[1].id = "b";
  page.next_page_token = "next";
  v1::ListJobsResponse out;
  ToProto(page, &out);
  ASSERT_EQ(out.jobs_size(), 2);
  EXPECT_EQ(out.jobs(1).id(), "b");
  EXPECT_EQ(out.next_page_token(), "next");
}

TEST(ResultToProtoTest, ABulkRetryResultCarriesMatchedAndRetried) {
  v1::RetryJobResponse out;
  ToProto(core::RetryJobsResult{.matched = 4, .retried = 3}, &out);
  EXPECT_EQ(out.matched(), 4);
  EXPECT_EQ(out.retried(), 3);
}

TEST(ResultToProtoTest, AJobShowsALeaseDeadlineOnlyWhileActive) {
  core::Job j;
  j.id = "j";
  j.queue = "q";
  j.state = core::JobState::kCompleted;
  j.lease_deadline = kT;
  j.completed_at = kT;
  v1::Job out;
  ToProto(j, &out);
  EXPECT_EQ(out.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_FALSE(out.has_lease_deadline());
  EXPECT_EQ(*FromProto(out.completed_at(), "completed_at"), kT);
  j.state = core::JobState::kActive;
  ToProto(j, &out);
  EXPECT_EQ(*FromProto(out.lease_deadline(), "lease_deadline"), kT);
}

TEST(RetryJobFormTest, ExactlyOneOfJobIdAndQueueAndBulkFieldsOnlyWithQueue) {
  v1::RetryJobRequest one;
  one.set_job_id("j");
  EXPECT_THAT(CheckRetryJobForm(one), IsOk());
  v1::RetryJobRequest bulk;
  bulk.set_queue("q");
  bulk.set_limit(10);
  bulk.set_dry_run(true);
  EXPECT_THAT(CheckRetryJobForm(bulk), IsOk());

  v1::RetryJobRequest both = one;
  both.set_queue("q");
  EXPECT_THAT(CheckRetryJobForm(both),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exclusive")));
  EXPECT_THAT(CheckRetryJobForm(v1::RetryJobRequest{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id or queue")));
  v1::RetryJobRequest one_with_limit = one;
  one_with_limit.set_limit(5);
  EXPECT_THAT(CheckRetryJobForm(one_with_limit),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only with queue")));
}

}  // namespace
}  // namespace jobbroker::server
