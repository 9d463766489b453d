// Recurring schedules in the broker: putting them, their runs coming due on the fake clock, each
// run enqueued once across restarts and failed writes, catch-up after downtime, pause, trigger,
// delete, and bad input. When a cron or `every` runs (DST included) is schedule/plan's, tested in
// tests/schedule.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "schedule/plan.h"
#include "tests/core/broker_test_util.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {
namespace {

using ::jobbroker::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class BrokerSchedulesTest : public BrokerFixture {
 protected:
  static Schedule Every(const std::string& id, absl::Duration every, std::string queue = "q") {
    Schedule s;
    s.id = id;
    s.every = every;
    s.job.queue = std::move(queue);
    s.job.payload = "run";
    return s;
  }
  ScheduleInfo Put(Schedule s) {
    auto r = broker_->PutSchedule(std::move(s));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ScheduleInfo{};
  }
  Schedule Stored(const std::string& id) {
    auto r = broker_->GetSchedule(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->schedule : Schedule{};
  }
  // The dedup keys of the queue's jobs, oldest first.
  std::vector<std::string> Runs(const std::string& queue = "q") {
    std::vector<std::string> keys;
    for (JobState state : {JobState::kReady, JobState::kScheduled}) {
      auto listed = broker_->ListJobs(ListJobsSpec{.queue = queue, .state = state});
      if (absl::IsNotFound(listed.status())) return keys;  // no run has made the queue yet
      EXPECT_TRUE(listed.ok()) << listed.status();
      if (!listed.ok()) continue;
      for (const Job& j : listed->jobs) keys.push_back(j.dedup_key);
    }
    return keys;
  }
  static std::string Key(const std::string& id, absl::Duration after_start) {
    return schedule::DedupKeyOf(id, kStart + after_start);
  }
};

TEST_F(BrokerSchedulesTest, APutScheduleIsStoredWithItsFirstRunAndOutputFields) {
  ScheduleInfo put = Put(Every("tick", absl::Minutes(5)));
  EXPECT_EQ(put.schedule.created_at, kStart);
  EXPECT_EQ(put.schedule.next_run_at, kStart + absl::Minutes(5));
  EXPECT_EQ(put.schedule.last_run_at, absl::InfinitePast());
  EXPECT_THAT(put.error, IsEmpty());
  EXPECT_EQ(Stored("tick"), put.schedule);
  Reopen();
  EXPECT_EQ(Stored("tick"), put.schedule) << "recovered from the store as it was put";
  EXPECT_THAT(broker_->ListSchedules(), SizeIs(1));
  EXPECT_THAT(broker_->ListSchedules("other"), IsEmpty());
  EXPECT_THAT(Runs(), IsEmpty()) << "nothing runs before its first run";
}

TEST_F(BrokerSchedulesTest, EachRunIsEnqueuedOnceWithItsDedupKeyAndTheScheduleMovesOn) {
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  EXPECT_EQ(broker_->Tick(), kStart + absl::Minutes(2)) << "the ticker next wakes for the next run";
  broker_->Tick();
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("tick", absl::Minutes(1))));
  Schedule s = Stored("tick");
  EXPECT_EQ(s.last_run_at, kStart + absl::Minutes(1));
  EXPECT_EQ(s.next_run_at, kStart + absl::Minutes(2));
  EXPECT_EQ(Get(s.last_job_id).payload, "run");
  clock_.Advance(absl::Seconds(30));
  broker_->Tick();
  EXPECT_THAT(Runs(), SizeIs(1)) << "the next run is not due yet";
  clock_.Advance(absl::Seconds(30));
  broker_->Tick();
  EXPECT_THAT(Runs(),
              ::testing::ElementsAre(Key("tick", absl::Minutes(1)), Key("tick", absl::Minutes(2))));
}

TEST_F(BrokerSchedulesTest, ARestartAfterARunDoesNotEnqueueItAgain) {
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  Reopen();
  broker_->Tick();
  EXPECT_THAT(Runs(), SizeIs(1));
  EXPECT_EQ(Stored("tick").next_run_at, kStart + absl::Minutes(2));
}

TEST_F(BrokerSchedulesTest, ARunWhoseWriteFailedIsEnqueuedOnceWhenTheStoreIsBack) {
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  store_.FailWritesAfter(0);
  broker_->Tick();  // the run and the schedule's move are one write: both fail
  store_.FailWritesAfter(-1);
  EXPECT_EQ(store_.job_count(), 0u);
  clock_.Advance(absl::Seconds(2));
  broker_->Tick();  // resumes writes, rebuilding memory from the store
  broker_->Tick();
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("tick", absl::Minutes(1))));
  EXPECT_EQ(store_.job_count(), 1u);
  Reopen();
  broker_->Tick();
  EXPECT_THAT(Runs(), SizeIs(1));
}

TEST_F(BrokerSchedulesTest, AfterDowntimeCatchUpOneRunsTheLatestMissedRunOnce) {
  Put(Every("one", absl::Minutes(5)));
  Schedule none = Every("none", absl::Minutes(5), "q2");
  none.catch_up = ScheduleCatchUp::kNone;
  Put(none);
  broker_.reset();  // down for 12 minutes: the runs of minutes 5 and 10 are missed
  clock_.Advance(absl::Minutes(12));
  Reopen();
  broker_->Tick();
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("one", absl::Minutes(10))))
      << "one run, named by the latest missed time";
  EXPECT_THAT(Runs("q2"), IsEmpty()) << "catch_up NONE skips what was missed";
  EXPECT_EQ(Stored("one").next_run_at, kStart + absl::Minutes(15));
  EXPECT_EQ(Stored("none").next_run_at, kStart + absl::Minutes(15));
  clock_.Advance(absl::Minutes(3));
  broker_->Tick();
  EXPECT_THAT(Runs("q2"), ::testing::ElementsAre(Key("none", absl::Minutes(15))))
      << "and goes on with the next run";
}

TEST_F(BrokerSchedulesTest, ARunLessThanAMinuteLateIsNotCaughtUpButRunEvenWithCatchUpNone) {
  Schedule none = Every("none", absl::Minutes(5));
  none.catch_up = ScheduleCatchUp::kNone;
  Put(none);
  broker_.reset();  // a restart that took 40 s across the run of minute 5
  clock_.Advance(absl::Seconds(340));
  Reopen();
  broker_->Tick();
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("none", absl::Minutes(5))));
}

TEST_F(BrokerSchedulesTest, APausedScheduleRunsNothingAndResumesWithTheNextRunAfterNow) {
  Schedule s = Every("tick", absl::Minutes(1));
  s.paused = true;
  Put(s);
  clock_.Advance(absl::Minutes(5));
  broker_->Tick();
  EXPECT_THAT(Runs(), IsEmpty());
  clock_.Advance(absl::Seconds(20));
  s.paused = false;
  EXPECT_EQ(Put(s).schedule.next_run_at, kStart + absl::Minutes(6));
  clock_.Advance(absl::Seconds(40));
  broker_->Tick();
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("tick", absl::Minutes(6))))
      << "no catch-up of what came due while paused";
}

TEST_F(BrokerSchedulesTest, ReplacingTheTemplateKeepsTheTimingAndTheHistory) {
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  const Schedule before = Stored("tick");
  clock_.Advance(absl::Seconds(10));
  Schedule changed = Every("tick", absl::Minutes(1));
  changed.job.payload = "v2";
  Schedule after = Put(changed).schedule;
  EXPECT_EQ(after.created_at, before.created_at);
  EXPECT_EQ(after.last_job_id, before.last_job_id);
  EXPECT_EQ(after.next_run_at, before.next_run_at);
  changed.every = absl::Minutes(10);
  EXPECT_EQ(Put(changed).schedule.next_run_at, kStart + absl::Minutes(10))
      << "a new timing starts from the schedule's creation (its anchor), after now";
}

TEST_F(BrokerSchedulesTest, TriggerRunsNowOnceAPairOfClicksAndLeavesTheTimingAlone) {
  Put(Every("tick", absl::Hours(1)));
  clock_.Advance(absl::Milliseconds(1500));
  auto first = broker_->TriggerSchedule("tick");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->deduplicated);
  auto second = broker_->TriggerSchedule("tick");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->deduplicated) << "the same second names the same run";
  EXPECT_EQ(second->job_id, first->job_id);
  EXPECT_THAT(Runs(), ::testing::ElementsAre(Key("tick", absl::Seconds(1))));
  Schedule s = Stored("tick");
  EXPECT_EQ(s.last_job_id, first->job_id);
  EXPECT_EQ(s.next_run_at, kStart + absl::Hours(1));
  EXPECT_THAT(broker_->TriggerSchedule("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BrokerSchedulesTest, DeleteStopsTheRunsAndKeepsWhatTheyEnqueued) {
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  ASSERT_TRUE(broker_->DeleteSchedule("tick").ok());
  EXPECT_THAT(broker_->GetSchedule("tick"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("schedule tick not found")));
  clock_.Advance(absl::Minutes(5));
  broker_->Tick();
  EXPECT_THAT(Runs(), SizeIs(1));
  Reopen();
  EXPECT_THAT(broker_->ListSchedules(), IsEmpty()) << "the delete was stored";
  EXPECT_THAT(broker_->DeleteSchedule("tick"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BrokerSchedulesTest, ARunThatCannotBeEnqueuedIsSkippedAndSaysWhy) {
  ASSERT_TRUE(broker_->UpdateQueuePolicy("q", PolicyOverride{.max_length = 1}).ok());
  Enqueue("q");
  Put(Every("tick", absl::Minutes(1)));
  clock_.Advance(absl::Minutes(1));
  broker_->Tick();
  auto info = broker_->GetSchedule("tick");
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->error, HasSubstr("was not enqueued: queue q is full"));
  EXPECT_EQ(info->schedule.next_run_at, kStart + absl::Minutes(2)) << "the next run is not held up";
  EXPECT_EQ(info->schedule.last_run_at, absl::InfinitePast());
}

TEST_F(BrokerSchedulesTest, BadInputNamesTheFieldAndStoresNothing) {
  struct Case {
    std::string field;
    std::function<void(Schedule&)> spoil;
  };
  const std::vector<Case> cases = {
      {"schedule.schedule_id", [](Schedule& s) { s.id = ""; }},
      {"schedule.schedule_id", [](Schedule& s) { s.id = "a b"; }},
      {"schedule.template.queue", [](Schedule& s) { s.job.queue = ""; }},
      {"schedule.template.dedup_key", [](Schedule& s) { s.job.dedup_key = "k"; }},
      {"schedule.template.delay", [](Schedule& s) { s.job.delay = absl::Seconds(1); }},
      {"schedule.template.run_at", [](Schedule& s) { s.job.run_at = kStart; }},
      {"schedule.template.expire_at", [](Schedule& s) { s.job.expire_at = kStart; }},
      {"schedule.template.timeout", [](Schedule& s) { s.job.timeout = absl::Milliseconds(1); }},
      {"schedule.cron", [](Schedule& s) { s.cron = "* * * * *"; }},  // and every: both
      {"schedule.cron",
       [](Schedule& s) {
         s.every = absl::ZeroDuration();
         s.cron = "61 * * * *";
       }},
      {"schedule.every", [](Schedule& s) { s.every = absl::Milliseconds(500); }},
      {"schedule.time_zone", [](Schedule& s) { s.time_zone = "Mars/Olympus_Mons"; }},
      {"schedule.end_at",
       [](Schedule& s) {
         s.start_at = kStart;
         s.end_at = kStart;
       }},
  };
  for (const Case& c : cases) {
    Schedule s = Every("tick", absl::Minutes(1));
    c.spoil(s);
    EXPECT_THAT(broker_->PutSchedule(s),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
  EXPECT_THAT(broker_->ListSchedules(), IsEmpty());
  EXPECT_THAT(broker_->GetSchedule(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schedule_id is required")));
  Reopen();
  EXPECT_THAT(broker_->ListSchedules(), IsEmpty());
}

}  // namespace
}  // namespace jobbroker::core
