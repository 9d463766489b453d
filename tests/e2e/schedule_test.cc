// Recurring schedules against the real binary: the Admin calls through the C++ client, runs
// enqueued on the wall clock, and every run enqueued once across repeated kill -9s.
#include <grpcpp/grpcpp.h>

#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::Schedule EverySecond(const std::string& id, const std::string& queue) {
  v1::Schedule s;
  s.set_schedule_id(id);
  s.mutable_every()->set_seconds(1);
  s.mutable_template_()->set_queue(queue);
  s.mutable_template_()->set_payload("tick");
  return s;
}

class ScheduleTest : public BrokerFixture {
 protected:
  // Every job of `queue` by dedup key (each key once: a second job with a key fails the test).
  std::map<std::string, std::string> JobsByKey(const std::string& queue) {
    std::map<std::string, std::string> jobs;
    v1::ListJobsRequest req;
    req.set_queue(queue);
    req.set_page_size(1000);
    for (;;) {
      v1::ListJobsResponse resp;
      grpc::Status s = client().ListJobs(req, &resp);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) break;  // no run has made the queue yet
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const v1::Job& j : resp.jobs()) {
        EXPECT_TRUE(jobs.emplace(j.dedup_key(), j.id()).second)
            << "two jobs for run " << j.dedup_key();
      }
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
    }
    return jobs;
  }
};

TEST_F(ScheduleTest, TheClientPutsListsTriggersAndDeletesAScheduleAndItRunsEverySecond) {
  client::Client c({.address = process().address()});
  absl::StatusOr<v1::Schedule> put = c.PutSchedule(EverySecond("tick", "ticks"));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->has_next_run_at());
  EXPECT_TRUE(put->has_created_at());
  EXPECT_EQ(put->template_().payload(), "tick");
  ASSERT_TRUE(WaitFor([&] { return JobsByKey("ticks").size() >= 2; }));
  absl::StatusOr<v1::Schedule> got = c.GetSchedule("tick");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->last_job_id(), ::testing::Not(::testing::IsEmpty()));
  absl::StatusOr<std::vector<v1::Schedule>> all = c.ListSchedules();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 1u);
  absl::StatusOr<std::vector<v1::Schedule>> other = c.ListSchedules("other");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->empty());

  v1::Schedule paused = *got;
  paused.set_paused(true);
  ASSERT_TRUE(c.PutSchedule(paused).ok());
  absl::StatusOr<v1::TriggerScheduleResponse> run = c.TriggerSchedule("tick");
  ASSERT_TRUE(run.ok()) << run.status();
  absl::StatusOr<v1::Schedule> after = c.GetSchedule("tick");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->last_job_id(), run->job_id()) << "a paused schedule still runs when triggered";
  const size_t runs = JobsByKey("ticks").size();
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(JobsByKey("ticks").size(), runs) << "paused: no more runs";

  ASSERT_TRUE(c.DeleteSchedule("tick").ok());
  EXPECT_EQ(c.GetSchedule("tick").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.DeleteSchedule("tick").code(), absl::StatusCode::kNotFound);
  v1::Schedule bad = EverySecond("bad", "ticks");
  bad.set_time_zone("Nowhere/Atlantis");
  EXPECT_THAT(std::string(c.PutSchedule(bad).status().message()), StartsWith("schedule.time_zone"));
}

TEST_F(ScheduleTest, EveryRunIsEnqueuedOnceAcrossRepeatedKill9s) {
  v1::PutScheduleRequest req;
  *req.mutable_schedule() = EverySecond("each-second", "runs");
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::Schedule put;
  ASSERT_TRUE(admin().PutSchedule(&ctx, req, &put).ok());

  // The first kill comes after a run: a put just before a whole second with a short first pause
  // would otherwise kill the broker before the schedule ever ran, and test no recovery of it.
  ASSERT_TRUE(WaitFor([&] { return !JobsByKey("runs").empty(); })) << "the schedule never ran";
  // Kills at random moments, so that some land while a run is being written.
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pause_ms(700, 2300);
  std::vector<std::pair<absl::Time, absl::Time>> down;  // from the kill to the restart
  for (int kill = 0; kill < 4; ++kill) {
    absl::SleepFor(absl::Milliseconds(pause_ms(random)));
    const absl::Time killed = absl::Now();
    ASSERT_NO_FATAL_FAILURE(Kill9AndRestart());
    down.emplace_back(killed, absl::Now());
  }
  absl::SleepFor(absl::Milliseconds(1500));

  const std::map<std::string, std::string> jobs = JobsByKey("runs");
  std::vector<absl::Time> runs;
  for (const auto& [key, id] : jobs) {
    ASSERT_THAT(key, StartsWith("each-second@"));
    absl::Time t;
    std::string error;
    const absl::string_view when = absl::string_view(key).substr(key.find('@') + 1);
    ASSERT_TRUE(absl::ParseTime(absl::RFC3339_full, when, &t, &error)) << key << ": " << error;
    runs.push_back(t);
  }
  ASSERT_GE(runs.size(), 5u);
  EXPECT_GT(runs.back(), down.back().second - absl::Seconds(1))
      << "runs go on after the last restart";
  EXPECT_LT(runs.front(), down.front().first) << "and ran before the first kill";
  // Keys sort as times. Between consecutive runs a second apart nothing was missed; a longer gap
  // must hold a downtime (the runs missed then are caught up as one).
  int gaps = 0;
  for (size_t i = 1; i < runs.size(); ++i) {
    if (runs[i] - runs[i - 1] <= absl::Seconds(1)) continue;
    ++gaps;
    bool explained = false;
    for (const auto& [from, to] : down) {
      // A run due in [from - 1s, to] may be missed: the one due just before the kill may not
      // have been written yet.
      explained |= from - absl::Seconds(1) < runs[i] && runs[i - 1] < to + absl::Seconds(1);
    }
    EXPECT_TRUE(explained) << "runs " << absl::FormatTime(runs[i - 1]) << " and "
                           << absl::FormatTime(runs[i]) << " are apart with no kill between";
  }
  std::cout << "schedule kill test: " << runs.size() << " runs, " << down.size() << " kill -9s, "
            << gaps << " gaps (downtime), every run key once\n";

  grpc::ClientContext get_ctx;
  get_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetScheduleRequest get;
  get.set_schedule_id("each-second");
  v1::Schedule stored;
  ASSERT_TRUE(admin().GetSchedule(&get_ctx, get, &stored).ok());
  EXPECT_THAT(stored.last_job_id(), ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(stored.error(), ::testing::IsEmpty());
  EXPECT_THAT(stored.schedule_id(), HasSubstr("each-second"));
}

}  // namespace
}  // namespace jobbroker::testing
