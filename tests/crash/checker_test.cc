// The crash harness's checker must be able to fail: each kind of violation, fed as crafted logs
// and a crafted final state, is reported; and a run where every rerun has a cause is clean.

#include "tests/crash/checker.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace jobbroker::crash {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr char kQueue[] = "crash.a";

std::string Line(std::vector<std::string> fields) { return absl::StrJoin(fields, "\t") + "\n"; }

std::string Enq(int64_t ts, const std::string& id, const std::string& key,
                const std::string& kind = kKindOk, bool dedup = false, int tries = 1,
                int batch = 0) {
  return Line({absl::StrCat(ts), "ENQ", id, key, kind, kQueue, dedup ? "1" : "0",
               absl::StrCat(tries), absl::StrCat(batch)});
}

std::string Recv(int64_t ts, const std::string& worker, const std::string& job, int attempt,
                 const std::string& lease) {
  return Line({absl::StrCat(ts), "RECV", worker, job, absl::StrCat(attempt), lease, "1"});
}

std::string AckOk(int64_t ts, const std::string& worker, const std::string& job, int attempt,
                  const std::string& lease) {
  return Line({absl::StrCat(ts), "ACK_OK", worker, job, absl::StrCat(attempt), lease});
}

std::string AckRefused(int64_t ts, const std::string& worker, const std::string& job, int attempt,
                       const std::string& lease) {
  return Line({absl::StrCat(ts), "ACK_REFUSED", worker, job, absl::StrCat(attempt), lease, "9"});
}

std::string FailOk(int64_t ts, const std::string& worker, const std::string& job, int attempt,
                   const std::string& lease, bool terminal) {
  return Line({absl::StrCat(ts), "FAIL_OK", worker, job, absl::StrCat(attempt), lease,
               terminal ? "1" : "0"});
}

std::string Driver(int64_t ts, const std::string& type, const std::string& subject) {
  return Line({absl::StrCat(ts), type, subject, "4242"});
}

struct AttemptSpec {
  int attempt;
  int64_t started_at;
  v1::AttemptOutcome outcome;
  int64_t ended_at = 0;  // 0: not set
};

v1::Job Job(const std::string& id, const std::string& key, v1::JobState state, int attempt,
            std::vector<AttemptSpec> attempts = {},
            v1::FailReason reason = v1::FAIL_REASON_UNSPECIFIED) {
  v1::Job job;
  job.set_id(id);
  job.set_queue(kQueue);
  job.set_dedup_key(key);
  job.set_state(state);
  job.set_attempt(attempt);
  job.set_fail_reason(reason);
  for (const AttemptSpec& a : attempts) {
    v1::AttemptRecord* r = job.add_attempts();
    r->set_attempt(a.attempt);
    *r->mutable_started_at() =
        google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(a.started_at);
    r->set_outcome(a.outcome);
    if (a.ended_at != 0) {
      *r->mutable_ended_at() =
          google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(a.ended_at);
    }
  }
  return job;
}

v1::Job Completed(const std::string& id, const std::string& key, int attempt = 1) {
  return Job(id, key, v1::JOB_STATE_COMPLETED, attempt);
}

struct Scenario {
  std::string producer;
  std::string worker;
  std::string driver;
  std::vector<v1::Job> final_jobs;

  Report Run() const {
    CrashLogs logs;
    ParseProducerLog("p1", producer, logs);
    ParseWorkerLog(worker, logs);
    ParseDriverLog(driver, logs);
    return Check(logs, final_jobs);
  }
};

std::vector<ViolationKind> Kinds(const Report& report) {
  std::vector<ViolationKind> kinds;
  for (const Violation& v : report.violations) kinds.push_back(v.kind);
  return kinds;
}

// Two runs of job J: attempt 1 on w1.1 (lease L1, leased at 1000), attempt 2 on w2.1 at 5000,
// which acks it. What happened in between is up to each test.
Scenario TwoRuns() {
  Scenario s;
  s.producer = Enq(10, "J", "p1-0");
  s.worker = Recv(1010, "w1.1", "J", 1, "L1") + Recv(5000, "w2.1", "J", 2, "L2") +
             AckOk(5010, "w2.1", "J", 2, "L2");
  s.final_jobs = {Job("J", "p1-0", v1::JOB_STATE_COMPLETED, 2,
                      {{1, 1000, v1::ATTEMPT_OUTCOME_LEASE_EXPIRED, 2000},
                       {2, 4990, v1::ATTEMPT_OUTCOME_COMPLETED, 5010}})};
  return s;
}

// TwoRuns() with a job of `kind` whose attempt 1 the broker recorded with `outcome`.
Scenario TwoRunsRecordedAs(v1::AttemptOutcome outcome, const std::string& kind = kKindOk) {
  Scenario s = TwoRuns();
  s.producer = Enq(10, "J", "p1-0", kind);
  s.final_jobs[0].mutable_attempts(0)->set_outcome(outcome);
  return s;
}

TEST(CheckerTest, CleanRunHasNoViolationsAndExplainsEveryRerun) {
  Scenario s;
  // A: acked at once. B: flaky, failed on purpose then acked. C: its worker was killed.
  // D: its worker was stopped before the push (the socket still took it). E: the broker crashed
  // between lease and ack, and the worker's late ack was refused. F: a batch job whose first
  // enqueue committed unanswered, found again by the retry.
  s.producer = Enq(10, "A", "p1-0") + Enq(11, "B", "p1-1", kKindFlaky) + Enq(12, "C", "p1-2") +
               Enq(13, "D", "p1-3") + Enq(14, "E", "p1-4") +
               Enq(15, "F", "p1-5", kKindOk, /*dedup=*/true, /*tries=*/3, /*batch=*/1) +
               Enq(16, "G", "p1-6", kKindPermanent) + Enq(17, "H", "p1-7", kKindExhaust);
  s.worker = Recv(100, "w1.1", "A", 1, "LA") + AckOk(110, "w1.1", "A", 1, "LA") +
             Recv(200, "w1.1", "B", 1, "LB1") + FailOk(210, "w1.1", "B", 1, "LB1", false) +
             Recv(400, "w2.1", "B", 2, "LB2") + AckOk(410, "w2.1", "B", 2, "LB2") +
             Recv(300, "w1.1", "C", 1, "LC1") + Recv(2000, "w2.1", "C", 2, "LC2") +
             AckOk(2010, "w2.1", "C", 2, "LC2") + Recv(3900, "w3.1", "D", 1, "LD1") +
             Recv(3500, "w2.1", "D", 2, "LD2") + AckOk(3510, "w2.1", "D", 2, "LD2") +
             AckRefused(3910, "w3.1", "D", 1, "LD1") + Recv(600, "w2.1", "E", 1, "LE1") +
             Recv(1900, "w2.1", "E", 2, "LE2") + AckRefused(1950, "w2.1", "E", 1, "LE1") +
             AckOk(1960, "w2.1", "E", 2, "LE2") + Recv(700, "w2.1", "F", 1, "LF") +
             AckOk(710, "w2.1", "F", 1, "LF") + Recv(720, "w2.1", "G", 1, "LG") +
             FailOk(730, "w2.1", "G", 1, "LG", true) + Recv(740, "w2.1", "H", 1, "LH") +
             FailOk(750, "w2.1", "H", 1, "LH", true);
  s.driver = Driver(350, "WORKER_KILL", "w1.1") + Driver(650, "BROKER_KILL", "1") +
             Driver(2500, "WORKER_STOP", "w3.1") + Driver(3800, "WORKER_CONT", "w3.1");
  s.final_jobs = {
      Completed("A", "p1-0"),
      Completed("B", "p1-1", 2),
      Completed("C", "p1-2", 2),
      Job("D", "p1-3", v1::JOB_STATE_COMPLETED, 2,
          {{1, 2600, v1::ATTEMPT_OUTCOME_LEASE_EXPIRED}, {2, 3400, v1::ATTEMPT_OUTCOME_COMPLETED}}),
      Completed("E", "p1-4", 2),
      Completed("F", "p1-5"),
      Job("G", "p1-6", v1::JOB_STATE_FAILED, 1, {}, v1::FAIL_REASON_PERMANENT),
      Job("H", "p1-7", v1::JOB_STATE_FAILED, 1, {}, v1::FAIL_REASON_ATTEMPTS_EXHAUSTED),
  };

  const Report report = s.Run();

  EXPECT_TRUE(report.ok()) << report.ViolationList();
  const Summary& sum = report.summary;
  EXPECT_EQ(sum.jobs_enqueued, 8);
  EXPECT_EQ(sum.batches, 1);
  EXPECT_EQ(sum.dedup_hits_after_crash, 1);
  EXPECT_EQ(sum.runs, 12);
  EXPECT_EQ(sum.jobs_run_more_than_once, 4);
  EXPECT_EQ(sum.reruns.at(RerunCause::kIntendedRetry), 1);
  EXPECT_EQ(sum.reruns.at(RerunCause::kWorkerKill), 1);
  EXPECT_EQ(sum.reruns.at(RerunCause::kWorkerStop), 1);
  EXPECT_EQ(sum.reruns.at(RerunCause::kBrokerCrash), 1);
  EXPECT_EQ(sum.reruns.at(RerunCause::kUnexplained), 0);
  EXPECT_EQ(sum.broker_kills, 1);
  EXPECT_EQ(sum.worker_kills, 1);
  EXPECT_EQ(sum.worker_stops, 1);
  EXPECT_EQ(sum.lost, 0);
  EXPECT_THAT(report.SummaryTable(), HasSubstr("violations"));
}

TEST(CheckerTest, ReportsLostJob) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0") + Enq(20, "B", "p1-1");
  s.final_jobs = {Completed("A", "p1-0")};

  const Report report = s.Run();

  ASSERT_THAT(report.violations, ElementsAre(Field(&Violation::job_id, "B")));
  EXPECT_EQ(report.violations[0].kind, ViolationKind::kLost);
  EXPECT_EQ(report.summary.lost, 1);
}

TEST(CheckerTest, ReportsJobThatEndedOtherwiseThanItsKindSays) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0", kKindPermanent) + Enq(11, "B", "p1-1", kKindExhaust) +
               Enq(12, "C", "p1-2");
  s.final_jobs = {Completed("A", "p1-0"),
                  Job("B", "p1-1", v1::JOB_STATE_FAILED, 1, {}, v1::FAIL_REASON_PERMANENT),
                  Job("C", "p1-2", v1::JOB_STATE_READY, 0)};

  EXPECT_THAT(Kinds(s.Run()),
              ElementsAre(ViolationKind::kWrongFinalState, ViolationKind::kWrongFinalState,
                          ViolationKind::kWrongFinalState));
}

TEST(CheckerTest, ReportsJobNoEnqueueReturned) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0");
  s.worker = Recv(100, "w1.1", "X", 1, "LX") + AckOk(110, "w1.1", "X", 1, "LX") +
             Recv(120, "w1.1", "A", 1, "LA") + AckOk(130, "w1.1", "A", 1, "LA");
  s.final_jobs = {Completed("A", "p1-0"), Completed("X", "")};

  const Report report = s.Run();

  // Once because the broker holds it, once because a worker ran it.
  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kUnknownJob, ViolationKind::kUnknownJob));
  EXPECT_THAT(report.violations, Each(Field(&Violation::job_id, "X")));
}

TEST(CheckerTest, ReportsTwoJobIdsForOneDedupKey) {
  Scenario s;
  // The producer was answered with two ids for one key (its retry created a second job).
  s.producer = Enq(10, "A", "p1-0") + Enq(20, "B", "p1-0", kKindOk, false, 2);
  s.final_jobs = {Completed("A", "p1-0"), Completed("B", "p1-0")};

  const Report report = s.Run();

  // Once from the producer's answers, once from the broker's final state.
  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kDedupTwoIds, ViolationKind::kDedupTwoIds));
}

TEST(CheckerTest, ReportsDedupHitOnAFirstTry) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0", kKindOk, /*dedup=*/true, /*tries=*/1);
  s.final_jobs = {Completed("A", "p1-0")};

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kSpuriousDedup));
}

TEST(CheckerTest, ReportsUnexplainedDuplicate) {
  const Report report = TwoRuns().Run();

  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kUnexplainedDuplicate));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("ATTEMPT_OUTCOME_LEASE_EXPIRED"));
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kUnexplained), 1);
}

TEST(CheckerTest, KillOfAnotherWorkerOrOutsideTheWindowExplainsNothing) {
  Scenario s = TwoRuns();
  s.driver = Driver(2000, "WORKER_KILL", "w3.1") +  // not the worker that held attempt 1
             Driver(900, "WORKER_KILL", "w1.1") +   // before attempt 1 was leased
             Driver(6000, "BROKER_KILL", "1") +     // after the rerun
             Driver(200, "WORKER_STOP", "w1.1") + Driver(900, "WORKER_CONT", "w1.1");

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kUnexplainedDuplicate));
}

TEST(CheckerTest, EachCauseInTheWindowExplainsTheRerun) {
  for (const auto& [event, cause] : std::vector<std::pair<std::string, RerunCause>>{
           {Driver(2000, "WORKER_KILL", "w1.1"), RerunCause::kWorkerKill},
           {Driver(2000, "WORKER_STOP", "w1.1"), RerunCause::kWorkerStop},
           {Driver(2000, "BROKER_KILL", "3"), RerunCause::kBrokerCrash}}) {
    Scenario s = TwoRuns();
    s.driver = event;
    const Report report = s.Run();
    EXPECT_TRUE(report.ok()) << event << report.ViolationList();
    EXPECT_EQ(report.summary.reruns.at(cause), 1) << event;
  }
}

TEST(CheckerTest, WorkerErrorExplainsRerunOnlyForKindsMeantToFail) {
  // The worker's fail committed but its answer was lost: only the broker's record tells.
  Scenario flaky = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_ERROR, kKindFlaky);
  const Report flaky_report = flaky.Run();
  EXPECT_TRUE(flaky_report.ok()) << flaky_report.ViolationList();
  EXPECT_EQ(flaky_report.summary.reruns.at(RerunCause::kIntendedRetry), 1);

  // A worker never fails an `ok` job; a crash in the window does not make that a lease expiry.
  Scenario ok = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_ERROR, kKindOk);
  ok.driver = Driver(2000, "BROKER_KILL", "1");
  EXPECT_THAT(Kinds(ok.Run()), ElementsAre(ViolationKind::kUnexplainedDuplicate));
}

TEST(CheckerTest, ATimeOutExplainsARerunOnlyForSlowJobs) {
  Scenario slow = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_TIMED_OUT, kKindSlow);
  const Report slow_report = slow.Run();
  EXPECT_TRUE(slow_report.ok()) << slow_report.ViolationList();
  EXPECT_EQ(slow_report.summary.reruns.at(RerunCause::kTimedOut), 1);

  // An `ok` job has no run-time limit: the broker timing it out is a violation, crash or not.
  Scenario ok = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_TIMED_OUT, kKindOk);
  ok.driver = Driver(2000, "BROKER_KILL", "1");
  EXPECT_THAT(Kinds(ok.Run()), ElementsAre(ViolationKind::kUnexplainedDuplicate));
}

TEST(CheckerTest, ReportsRerunAfterTheBrokerRecordedCompletion) {
  // No worker heard the ack, but the broker recorded attempt 1 completed, then leased it again.
  Scenario s = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_COMPLETED);
  s.driver = Driver(2000, "BROKER_KILL", "1");

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kUndoneAck));
}

TEST(CheckerTest, ReportsAttemptThatStartedBeforeThePreviousEnded) {
  Scenario s = TwoRuns();
  s.driver = Driver(2000, "WORKER_KILL", "w1.1");
  // Attempt 2 was leased at 1500, while attempt 1's lease ran until 2000.
  s.final_jobs[0].mutable_attempts(1)->mutable_started_at()->CopyFrom(
      google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(1500));

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kOverlappingLease));
}

TEST(CheckerTest, ReportsAckThatDidNotStick) {
  Scenario s;
  // The broker answered the ack of attempt 1, yet the job ended with attempt 2.
  s.producer = Enq(10, "A", "p1-0");
  s.worker = Recv(100, "w1.1", "A", 1, "L1") + AckOk(110, "w1.1", "A", 1, "L1");
  s.final_jobs = {Completed("A", "p1-0", 2)};

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kUndoneAck));
}

TEST(CheckerTest, ReportsJobReceivedAgainAfterItsAckWasAcknowledged) {
  Scenario s = TwoRuns();
  // Attempt 1's ack was answered OK; a broker crash lies in the window, which explains a rerun
  // of an unacknowledged lease but never one of an acknowledged ack.
  s.worker += AckOk(1020, "w1.1", "J", 1, "L1");
  s.driver = Driver(2000, "BROKER_KILL", "1");

  const Report report = s.Run();

  EXPECT_THAT(Kinds(report),
              UnorderedElementsAre(ViolationKind::kUndoneAck, ViolationKind::kUndoneAck));
  EXPECT_THAT(report.ViolationList(), HasSubstr("received again"));
}

TEST(CheckerTest, ReportsTerminalFailThatDidNotStick) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0", kKindPermanent);
  s.worker = Recv(100, "w1.1", "A", 1, "L1") + FailOk(110, "w1.1", "A", 1, "L1", true);
  s.final_jobs = {Job("A", "p1-0", v1::JOB_STATE_READY, 1)};

  EXPECT_THAT(Kinds(s.Run()),
              UnorderedElementsAre(ViolationKind::kWrongFinalState, ViolationKind::kUndoneAck));
}

TEST(CheckerTest, ReportsAttemptNumberLeasedTwice) {
  Scenario s = TwoRuns();
  s.worker = Recv(1010, "w1.1", "J", 1, "L1") + Recv(5000, "w2.1", "J", 1, "L2") +
             AckOk(5010, "w2.1", "J", 1, "L2");
  s.driver = Driver(2000, "BROKER_KILL", "1");
  s.final_jobs = {Completed("J", "p1-0", 1)};

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kAttemptReused));
}

TEST(CheckerTest, SkipsTornLastLineAndReportsMalformedOnes) {
  Scenario s;
  s.producer = Enq(10, "A", "p1-0") + "11\tENQ\tB";  // killed mid-write: no newline
  s.worker = "12\tRECV\tw1.1\tA\tnot-a-number\tL1\t1\n";
  s.final_jobs = {Completed("A", "p1-0")};

  const Report report = s.Run();

  EXPECT_EQ(report.summary.torn_lines, 1);
  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kMalformedLog));
}

TEST(CheckerTest, ParsesEveryDriverLineType) {
  CrashLogs logs;
  ParseDriverLog(Line({"1", "SEED", "7"}) + Driver(2, "BROKER_UP", "1") +
                     Driver(3, "BROKER_KILL", "1") + Driver(4, "WORKER_UP", "w1.1") +
                     Driver(5, "WORKER_KILL", "w1.1") + Driver(6, "WORKER_STOP", "w1.2") +
                     Driver(7, "WORKER_CONT", "w1.2") + Line({"8", "PRODUCER_EXIT", "p1", "0"}) +
                     Line({"9", "SETTLED", "1"}),
                 logs);

  EXPECT_THAT(logs.malformed, IsEmpty());
  EXPECT_EQ(logs.driver_events.size(), 9u);
}

// ---- The cluster harness: faults explain reruns ----

std::string Fault(int64_t ts, int id, const std::string& kind, const std::string& target) {
  return Line({absl::StrCat(ts), "FAULT", absl::StrCat(id), kind, target});
}

std::string Heal(int64_t ts, int id) { return Line({absl::StrCat(ts), "HEAL", absl::StrCat(id)}); }

TEST(CheckerClusterTest, AFaultOverlappingTheWindowExplainsTheRerun) {
  // Attempt 1 was leased at 1000 and attempt 2 received at 5000: a fault over [1500, 3000] (or
  // one that began before the lease and healed inside the window) lies in between.
  for (const std::string& driver : {Fault(1500, 1, "kill-leader", "node-1") + Heal(3000, 1),
                                    Fault(500, 1, "cut-etcd", "node-2") + Heal(1200, 1)}) {
    Scenario s = TwoRuns();
    s.driver = driver;
    const Report report = s.Run();
    EXPECT_TRUE(report.ok()) << driver << report.ViolationList();
    EXPECT_EQ(report.summary.reruns.at(RerunCause::kClusterFault), 1) << driver;
    EXPECT_EQ(report.summary.reruns.at(RerunCause::kUnexplained), 0) << driver;
    EXPECT_EQ(report.summary.cluster_faults, 1);
  }
}

TEST(CheckerClusterTest, AFaultNeverHealedExplainsEveryRerunAfterIt) {
  Scenario s = TwoRuns();
  s.driver = Fault(2000, 7, "disk-full", "node-0");

  const Report report = s.Run();

  EXPECT_TRUE(report.ok()) << report.ViolationList();
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kClusterFault), 1);
  EXPECT_EQ(report.summary.cluster_faults_unhealed, 1);
}

TEST(CheckerClusterTest, AFaultHealedBeforeTheLeaseOrBegunAfterTheRerunExplainsNothing) {
  Scenario s = TwoRuns();
  s.driver = Fault(100, 1, "kill-leader", "node-1") + Heal(900, 1) +  // over before the lease
             Fault(6000, 2, "stop-leader", "node-2");                 // after the rerun

  const Report report = s.Run();

  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kUnexplainedDuplicate));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("cluster fault"));
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kClusterFault), 0);
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kUnexplained), 1);
}

TEST(CheckerClusterTest, TheCrashHarnessCausesComeBeforeAFault) {
  Scenario s = TwoRuns();
  s.driver =
      Fault(1500, 1, "kill-leader", "node-1") + Driver(2000, "BROKER_KILL", "1") + Heal(3000, 1);

  const Report report = s.Run();

  EXPECT_TRUE(report.ok()) << report.ViolationList();
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kBrokerCrash), 1);
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kClusterFault), 0);
}

TEST(CheckerClusterTest, AWorkerErrorOfAnOkJobIsNotExplainedByAFault) {
  Scenario s = TwoRunsRecordedAs(v1::ATTEMPT_OUTCOME_ERROR, kKindOk);
  s.driver = Fault(1500, 1, "kill-leader", "node-1") + Heal(3000, 1);

  EXPECT_THAT(Kinds(s.Run()), ElementsAre(ViolationKind::kUnexplainedDuplicate));
}

TEST(CheckerClusterTest, AHealOfNoEarlierFaultIsMalformed) {
  Scenario s = TwoRuns();
  // HEAL 3 before its FAULT, HEAL 9 of none, FAULT 4 twice, HEAL 4 twice.
  s.driver = Heal(1100, 3) + Fault(1200, 3, "kill-leader", "node-1") + Heal(1300, 9) +
             Fault(1400, 4, "cut-peers", "node-0") + Fault(1500, 4, "cut-peers", "node-0") +
             Heal(1600, 4) + Heal(1700, 4) + Heal(1800, 3);

  const Report report = s.Run();

  EXPECT_THAT(Kinds(report),
              ElementsAre(ViolationKind::kMalformedLog, ViolationKind::kMalformedLog,
                          ViolationKind::kMalformedLog, ViolationKind::kMalformedLog));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("HEAL of no earlier FAULT"));
  EXPECT_THAT(report.violations[2].detail, HasSubstr("second FAULT"));
  EXPECT_THAT(report.violations[3].detail, HasSubstr("second HEAL"));
  EXPECT_EQ(report.summary.cluster_faults, 2);
  EXPECT_EQ(report.summary.reruns.at(RerunCause::kClusterFault), 1);
}

TEST(CheckerClusterTest, ParsesEveryClusterDriverLineType) {
  CrashLogs logs;
  ParseDriverLog(
      Fault(1, 1, "kill-leader", "node-1") + Driver(2, "NODE_KILL", "node-1") +
          Driver(3, "NODE_UP", "node-1") + Driver(4, "NODE_PAUSE", "node-2") +
          Driver(5, "NODE_CONT", "node-2") + Line({"6", "NODE_STOP", "node-0", "0"}) +
          Line({"7", "NODE_EXIT", "node-0", "1"}) + Line({"8", "NODE_SKEW", "node-0", "-7"}) +
          Line({"9", "ETCD_KILL", "etcd-2", "2"}) + Line({"10", "POWER_LOSS", "node-1", "0"}) +
          Heal(11, 1) + Line({"12", "FAULT", "2", "skew"}),  // no target
      logs);

  ASSERT_EQ(logs.driver_events.size(), 11u);
  EXPECT_THAT(logs.malformed, ElementsAre(HasSubstr("FAULT\t2\tskew")));
  const DriverEvent& fault = logs.driver_events[0];
  EXPECT_EQ(fault.type, DriverEventType::kFault);
  EXPECT_EQ(fault.value, 1);
  EXPECT_EQ(fault.subject, "kill-leader");
  EXPECT_EQ(fault.target, "node-1");
  EXPECT_EQ(logs.driver_events[7].type, DriverEventType::kNodeSkew);
  EXPECT_EQ(logs.driver_events[7].value, -7);
  EXPECT_EQ(logs.driver_events[10].type, DriverEventType::kHeal);
  EXPECT_EQ(logs.driver_events[10].value, 1);
}

TEST(CheckerClusterTest, TheSummaryCountsFaultsByKindAndOnlyAClusterRunShowsThem) {
  Scenario s = TwoRuns();
  s.driver = Fault(1500, 1, "kill-leader", "node-1") + Heal(1600, 1) +
             Fault(1700, 2, "kill-leader", "node-2") + Heal(1800, 2) +
             Fault(1900, 3, "power-loss", "node-0");

  const Report report = s.Run();

  EXPECT_EQ(report.summary.cluster_faults, 3);
  EXPECT_THAT(report.summary.faults_by_kind,
              UnorderedElementsAre(std::pair<const std::string, int64_t>("kill-leader", 2),
                                   std::pair<const std::string, int64_t>("power-loss", 1)));
  EXPECT_THAT(report.SummaryTable(), HasSubstr("faults: kill-leader"));
  EXPECT_THAT(report.SummaryTable(),
              HasSubstr("cluster fault (node, network, etcd, disk or clock)"));
  // The crash harness's table is as it was.
  Scenario crash = TwoRuns();
  crash.driver = Driver(2000, "BROKER_KILL", "1");
  const std::string table = crash.Run().SummaryTable();
  EXPECT_THAT(table, Not(HasSubstr("fault")));
  EXPECT_THAT(table, Not(HasSubstr("epoch")));
}

// ---- The cluster harness: one writer per epoch ----

// A partition_role line exactly as server/cluster/cluster_mode.cc writes it through log.cc.
std::string RoleLine(const std::string& node, int partition, const std::string& role, int64_t epoch,
                     const std::string& broken_json = "") {
  return absl::StrCat(
      "{\"time\":\"2026-12-03T13:12:14.141Z\",\"level\":\"", broken_json.empty() ? "info" : "error",
      "\",\"event\":\"partition_role\",\"partition\":\"", partition, "\",\"node\":\"", node,
      "\",\"role\":\"", role, "\",\"epoch\":\"", epoch,
      "\",\"serving\":\"true\",\"log_end\":\"12\",\"broken\":\"", broken_json, "\"}\n");
}

std::string DumpHeader(int partition, uint64_t base_seq, int64_t base_epoch, uint64_t applied,
                       uint64_t end, int64_t floor = 9) {
  return absl::StrCat("# partition ", partition, " floor ", floor, " base ", base_seq, "/",
                      base_epoch, " applied ", applied, " end ", end, "\n");
}

std::string DumpEntry(int partition, uint64_t seq, int64_t epoch, const std::string& digest) {
  return Line({absl::StrCat(partition), absl::StrCat(seq), absl::StrCat(epoch), digest});
}

// Three entries of partition 0, base 0: 1/3 (epoch start), 2/3, 3/5 (epoch 5's start).
std::string GoodDump() {
  return DumpHeader(0, 0, 0, 3, 3) + DumpEntry(0, 1, 3, "00aa") + DumpEntry(0, 2, 3, "00bb") +
         DumpEntry(0, 3, 5, "00cc") + DumpHeader(1, 0, 0, 0, 0);
}

Report CheckWriters(const std::vector<std::pair<std::string, std::string>>& node_logs,
                    const std::vector<std::pair<std::string, std::string>>& dumps) {
  CrashLogs logs;
  for (const auto& [node, text] : node_logs) ParseNodeLog(node, text, logs);
  for (const auto& [node, text] : dumps) ParseReplicaLogDump(node, text, logs);
  return Check(logs, {});
}

TEST(CheckerWritersTest, ANodeLogInTheRealFormatParses) {
  CrashLogs logs;
  ParseNodeLog(
      "node-2",
      "jobbroker: starting\n"
      "{\"time\":\"2026-12-03T13:12:14.100Z\",\"level\":\"info\",\"event\":\"serving\","
      "\"grpc\":\"127.0.0.1:1\"}\n"
      "E1203 13:12:14.120 grpc something about partition_roles\n" +
          RoleLine("node-2", 4, "leader", 16) + RoleLine("node-2", 5, "follower", 0) +
          // log.cc's escapes: a quote, a backslash, a newline, a tab, a control byte.
          RoleLine("node-2", 4, "follower", 0, "disk \\\"full\\\" \\\\ at\\n\\tx\\u0001y") +
          "{\"time\":\"x\",\"level\":\"info\",\"event\":\"partition_role\",\"partition\":\"4\","
          "\"node\":\"node-2\",\"role\":\"leader\"}\n"  // no epoch: malformed
          "{\"time\":\"x\",\"level\":\"info\",\"event\":\"partition_role\",\"parti",  // torn
      logs);

  ASSERT_EQ(logs.partition_roles.size(), 3u);
  const PartitionRoleRecord& leader = logs.partition_roles[0];
  EXPECT_EQ(leader.log, "node-2");
  EXPECT_EQ(leader.node, "node-2");
  EXPECT_EQ(leader.partition, 4u);
  EXPECT_EQ(leader.role, "leader");
  EXPECT_EQ(leader.epoch, 16);
  EXPECT_TRUE(leader.serving);
  EXPECT_EQ(leader.log_end, 12u);
  EXPECT_EQ(leader.time, "2026-12-03T13:12:14.141Z");
  EXPECT_EQ(logs.partition_roles[2].broken, "disk \"full\" \\ at\n\tx\x01y");
  // The gRPC line names partition_role but is no JSON: malformed, like the one with no epoch.
  EXPECT_THAT(logs.malformed,
              ElementsAre(HasSubstr("partition_roles"), HasSubstr("\"role\":\"leader\"}")));
  EXPECT_EQ(logs.torn_lines, 1);
}

TEST(CheckerWritersTest, OneLeaderPerEpochAndAgreeingLogsAreClean) {
  const std::string dump = GoodDump();
  const Report report = CheckWriters(
      {{"node-0", RoleLine("node-0", 0, "leader", 3) + RoleLine("node-0", 0, "leader", 3) +
                      RoleLine("node-0", 1, "follower", 0)},
       {"node-1", RoleLine("node-1", 0, "follower", 0) + RoleLine("node-1", 0, "leader", 5) +
                      RoleLine("node-1", 1, "leader", 4)}},
      {{"node-0", dump},
       {"node-1", dump},
       {"node-2",
        DumpHeader(0, 0, 0, 2, 2) + DumpEntry(0, 1, 3, "00aa") + DumpEntry(0, 2, 3, "00bb")}});

  EXPECT_TRUE(report.ok()) << report.ViolationList();
  EXPECT_EQ(report.summary.partitions_led, 2);
  EXPECT_EQ(report.summary.epochs_led, 3);
  EXPECT_EQ(report.summary.replica_logs, 5);
  EXPECT_EQ(report.summary.replica_entries, 8);
  EXPECT_EQ(report.summary.entries_compared, 3);
  EXPECT_THAT(report.SummaryTable(), HasSubstr("entries compared across nodes"));
}

TEST(CheckerWritersTest, TwoNodesLeadingOnePartitionInOneEpochAreTwoWriters) {
  const Report report = CheckWriters({{"node-0", RoleLine("node-0", 2, "leader", 7)},
                                      {"node-1", RoleLine("node-1", 2, "leader", 7)}},
                                     {});

  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kTwoWritersInEpoch));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("partition 2 epoch 7"));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("node-0"));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("node-1"));
  EXPECT_STREQ(ViolationKindName(report.violations[0].kind), "TWO_WRITERS_IN_EPOCH");
}

TEST(CheckerWritersTest, TheNodeFieldNamesTheWriterWhateverTheLogIsCalled) {
  // One node's two launches, read as two logs: one writer. Two nodes in one log file: two.
  const Report one = CheckWriters({{"node-0.1", RoleLine("node-0", 2, "leader", 7)},
                                   {"node-0.2", RoleLine("node-0", 2, "leader", 7)}},
                                  {});
  EXPECT_TRUE(one.ok()) << one.ViolationList();
  const Report two = CheckWriters(
      {{"all", RoleLine("node-0", 2, "leader", 7) + RoleLine("node-1", 2, "leader", 7)}}, {});
  EXPECT_THAT(Kinds(two), ElementsAre(ViolationKind::kTwoWritersInEpoch));
}

TEST(CheckerWritersTest, TwoEntriesAtOneSeqAndEpochAreTwoWriters) {
  const Report report =
      CheckWriters({}, {{"node-0", GoodDump()},
                        {"node-2", DumpHeader(0, 0, 0, 2, 2) + DumpEntry(0, 1, 3, "00aa") +
                                       DumpEntry(0, 2, 3, "ffff")}});

  EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kTwoWritersInEpoch));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("partition 0 seq 2 epoch 3"));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("node-2 ffff"));
  EXPECT_EQ(report.summary.entries_compared, 2);
}

TEST(CheckerWritersTest, OneSeqOfTwoEpochsIsNoViolation) {
  // node-2 kept epoch 3's uncommitted entry 3; epoch 5's leader wrote its own entry 3. Both are
  // stored entries of their epochs, and neither log is out of order.
  const Report report =
      CheckWriters({}, {{"node-0", GoodDump()},
                        {"node-2", DumpHeader(0, 0, 0, 2, 3) + DumpEntry(0, 1, 3, "00aa") +
                                       DumpEntry(0, 2, 3, "00bb") + DumpEntry(0, 3, 3, "0dd0")}});

  EXPECT_TRUE(report.ok()) << report.ViolationList();
  EXPECT_EQ(report.summary.entries_compared, 2);
}

TEST(CheckerWritersTest, ALogThatSkipsOrRepeatsASeqOrGoesBackAnEpochIsOutOfOrder) {
  struct Case {
    std::string dump;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {DumpHeader(0, 0, 0, 3, 3) + DumpEntry(0, 1, 3, "aa") + DumpEntry(0, 3, 3, "cc"),
            "entry 3/3 follows entry 1/3 (its seq does not follow)"},
           {DumpHeader(0, 0, 0, 2, 2) + DumpEntry(0, 1, 5, "aa") + DumpEntry(0, 2, 3, "bb"),
            "entry 2/3 follows entry 1/5 (its epoch goes back)"},
           {DumpHeader(0, 0, 0, 2, 2) + DumpEntry(0, 1, 3, "aa") + DumpEntry(0, 1, 3, "aa") +
                DumpEntry(0, 2, 3, "bb"),
            "entry 1/3 follows entry 1/3"},
           {DumpHeader(0, 4, 6, 5, 5) + DumpEntry(0, 5, 3, "aa"),
            "entry 5/3 follows the base 4/6 (its epoch goes back)"},
           {DumpHeader(0, 4, 6, 4, 6) + DumpEntry(0, 6, 6, "aa"), "its seq does not follow"},
           {DumpHeader(0, 0, 0, 1, 3) + DumpEntry(0, 1, 3, "aa"), "its header says end 3"},
           {DumpHeader(0, 2, 3, 1, 3) + DumpEntry(0, 3, 3, "aa"), "applied 1 lies outside"},
       }) {
    const Report report = CheckWriters({}, {{"node-1", c.dump}});
    EXPECT_THAT(Kinds(report), ElementsAre(ViolationKind::kLogOrder)) << c.dump;
    EXPECT_THAT(report.ViolationList(), HasSubstr(c.says)) << c.dump;
    EXPECT_THAT(report.ViolationList(), HasSubstr("node-1's log of partition 0")) << c.dump;
  }
}

TEST(CheckerWritersTest, DumpLinesThatAreNeitherHeaderNorEntryAreMalformed) {
  CrashLogs logs;
  ParseReplicaLogDump("node-0",
                      DumpEntry(0, 1, 3, "aa") +  // before any header
                          DumpHeader(0, 0, 0, 1, 1) + DumpEntry(1, 1, 3, "aa") +  // partition 1
                          DumpEntry(0, 1, 3, "not-hex") + "# partition 1 floor x\n" +
                          DumpEntry(0, 1, 3, "aa") +  // after a bad header
                          DumpHeader(0, 0, 0, 1, 1),  // a partition's header twice
                      logs);

  EXPECT_EQ(logs.malformed.size(), 6u) << absl::StrJoin(logs.malformed, "\n");
  EXPECT_THAT(logs.malformed, Each(HasSubstr("log dump node-0")));
  EXPECT_EQ(logs.replica_logs.size(), 1u);
  EXPECT_TRUE(logs.replica_entries.empty());
}

}  // namespace
}  // namespace jobbroker::crash

namespace jobbroker::crash {
namespace {

// A run of the harness's schedule at `second` (Unix seconds), as the final state shows it.
v1::Job ScheduledRun(const std::string& id, int64_t second) {
  v1::Job job =
      Job(id,
          absl::StrCat(kScheduleId, "@",
                       absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(second),
                                        absl::UTCTimeZone())),
          v1::JOB_STATE_READY, 0);
  job.set_queue(kScheduledQueue);
  return job;
}

constexpr int64_t kT0 = 1'800'000'000;  // seconds
constexpr int64_t kMicros = 1'000'000;

TEST(ScheduleCheckTest, RunsEverySecondAreCleanAndLeftOutOfTheProducersAccount) {
  Scenario s;
  for (int i = 0; i < 5; ++i) s.final_jobs.push_back(ScheduledRun(absl::StrCat("R", i), kT0 + i));
  const Report report = s.Run();
  EXPECT_TRUE(report.ok()) << report.ViolationList();
  EXPECT_EQ(report.summary.schedule_runs, 5);
  EXPECT_EQ(report.summary.schedule_gaps, 0);
  EXPECT_EQ(report.summary.final_other, 0) << "not counted as a producer's job";
}

TEST(ScheduleCheckTest, AGapAcrossABrokerKillIsExplainedAndOneWithoutIsAMissedRun) {
  Scenario s;
  s.final_jobs = {ScheduledRun("R0", kT0), ScheduledRun("R1", kT0 + 1), ScheduledRun("R4", kT0 + 4),
                  ScheduledRun("R9", kT0 + 9)};
  // Down from 1.5 s to 2.2 s (with a second's slack either side: 0.5 s to 3.2 s): the gap
  // 1 -> 4 is explained, 4 -> 9 is not.
  s.driver = Driver((kT0 + 1) * kMicros + 500'000, "BROKER_KILL", "1") +
             Driver((kT0 + 2) * kMicros + 200'000, "BROKER_UP", "2");
  const Report report = s.Run();
  ASSERT_THAT(Kinds(report), ElementsAre(ViolationKind::kScheduleRunMissed));
  EXPECT_THAT(report.violations[0].detail, HasSubstr("5000 ms apart"));
  EXPECT_EQ(report.summary.schedule_gaps, 1);
}

TEST(ScheduleCheckTest, TwoJobsForOneRunAndAJobNamingNoRunAreViolations) {
  Scenario s;
  s.final_jobs = {ScheduledRun("A", kT0), ScheduledRun("B", kT0), ScheduledRun("C", kT0 + 1)};
  v1::Job stray = ScheduledRun("D", kT0 + 2);
  stray.set_dedup_key("someone-else@2027-01-15T08:00:00Z");
  s.final_jobs.push_back(stray);
  const Report report = s.Run();
  EXPECT_THAT(Kinds(report),
              UnorderedElementsAre(ViolationKind::kScheduleRunTwice, ViolationKind::kUnknownJob));
}

}  // namespace
}  // namespace jobbroker::crash

namespace jobbroker::crash {
namespace {

TEST(DependencyCheckTest, AJobThatStartedBeforeItsDependencyCompletedIsAViolation) {
  Scenario s;
  s.producer = Enq(100, "P", "kp") + Enq(100, "C", "kc") + Enq(100, "E", "ke");
  v1::Job parent =
      Job("P", "kp", v1::JOB_STATE_COMPLETED, 1, {{1, 1000, v1::ATTEMPT_OUTCOME_COMPLETED, 2000}});
  *parent.mutable_completed_at() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(2000);
  v1::Job child =
      Job("C", "kc", v1::JOB_STATE_COMPLETED, 1, {{1, 2500, v1::ATTEMPT_OUTCOME_COMPLETED, 3000}});
  child.add_depends_on("P");
  v1::Job early =
      Job("E", "ke", v1::JOB_STATE_COMPLETED, 1, {{1, 1500, v1::ATTEMPT_OUTCOME_COMPLETED, 3000}});
  early.add_depends_on("P");
  s.final_jobs = {parent, child, early};
  s.worker = Recv(1000, "w1.1", "P", 1, "L1") + AckOk(2000, "w1.1", "P", 1, "L1") +
             Recv(2500, "w1.1", "C", 1, "L2") + AckOk(3000, "w1.1", "C", 1, "L2") +
             Recv(1500, "w1.1", "E", 1, "L3") + AckOk(3000, "w1.1", "E", 1, "L3");
  const Report report = s.Run();
  ASSERT_THAT(Kinds(report), ElementsAre(ViolationKind::kDependencyOrder))
      << report.ViolationList();
  EXPECT_EQ(report.violations[0].job_id, "E");
  EXPECT_EQ(report.summary.dependents, 2);
}

// Broker times come from the clock of the node that stamped them: with a node restarted 1 s off,
// a start up to 2 s before its dependency's completion may be the clocks, not the order; further
// off it is still a violation.
TEST(DependencyCheckTest, SkewedClocksAllowTwiceTheSkewAndNoMore) {
  Scenario s;
  s.producer = Enq(100, "P", "kp") + Enq(100, "C", "kc") + Enq(100, "E", "ke");
  v1::Job parent = Job("P", "kp", v1::JOB_STATE_COMPLETED, 1,
                       {{1, 1000, v1::ATTEMPT_OUTCOME_COMPLETED, 5'000'000}});
  *parent.mutable_completed_at() =
      google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(5'000'000);
  v1::Job skewed = Job("C", "kc", v1::JOB_STATE_COMPLETED, 1,
                       {{1, 3'500'000, v1::ATTEMPT_OUTCOME_COMPLETED, 6'000'000}});
  skewed.add_depends_on("P");
  v1::Job early = Job("E", "ke", v1::JOB_STATE_COMPLETED, 1,
                      {{1, 2'500'000, v1::ATTEMPT_OUTCOME_COMPLETED, 6'000'000}});
  early.add_depends_on("P");
  s.final_jobs = {parent, skewed, early};
  s.driver = Line({"50", "NODE_SKEW", "node-2", "-1"});
  s.worker = Recv(1000, "w1.1", "P", 1, "L1") + AckOk(5'000'000, "w1.1", "P", 1, "L1") +
             Recv(5'100'000, "w1.1", "C", 1, "L2") + AckOk(6'000'000, "w1.1", "C", 1, "L2") +
             Recv(5'100'000, "w1.1", "E", 1, "L3") + AckOk(6'000'000, "w1.1", "E", 1, "L3");
  const Report report = s.Run();
  ASSERT_THAT(Kinds(report), ElementsAre(ViolationKind::kDependencyOrder))
      << report.ViolationList();
  EXPECT_EQ(report.violations[0].job_id, "E");
}

}  // namespace
}  // namespace jobbroker::crash
