#pragma once

// Shared by the storage tests: sample records, a visitor that records what Recover reports, and
// a temporary directory per test.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/job.h"
#include "core/policy.h"
#include "core/store.h"
#include "gtest/gtest.h"

namespace jobbroker::storage {

// What a cold job's index entries are built from (core::ColdJobFields) is what the whole job
// says: recovery's light decode against the whole decode, or against the job that was put.
inline void ExpectSameIndexFields(const core::ColdJobFields& cold, const core::Job& whole) {
  EXPECT_EQ(cold.id, whole.id);
  EXPECT_EQ(cold.queue, whole.queue);
  EXPECT_EQ(cold.state, whole.state);
  EXPECT_EQ(cold.seq, whole.seq);
  EXPECT_EQ(cold.priority, whole.priority);
  EXPECT_EQ(cold.run_at, whole.run_at);
  EXPECT_EQ(cold.concurrency_key, whole.concurrency_key);
  EXPECT_EQ(cold.expire_at, whole.expire_at);
  EXPECT_EQ(cold.depends_on, whole.depends_on);
}

// A job with every member set to a non-default value, binary and non-UTF-8 bytes in the text
// fields, a history of attempts, and both infinities among its times. Extend it when Job grows.
inline core::Job FullJob(std::string id = "job-\xff-1") {
  core::Job j;
  j.id = std::move(id);
  j.queue = "emails";
  j.state = core::JobState::kActive;
  j.payload = std::string("\0\x01\xfe payload", 11);
  j.headers = {{"content-type", "application/json"}, {"x-\xff", std::string("a\0b", 3)}};
  j.priority = -7;
  j.seq = 1234567890123ULL;
  j.attempt = 3;
  j.max_attempts = 9;
  j.dedup_key = "order-42";
  j.concurrency_key = "tenant-9";
  j.created_at = absl::FromUnixMicros(1700000000123456);
  j.run_at = absl::FromUnixMicros(-86400000001);  // before 1970
  j.lease_duration = absl::Seconds(45);
  j.lease_id = "lease-3";
  j.worker_id = "worker-b";
  j.lease_deadline = absl::InfiniteFuture();
  j.lease_length = absl::Milliseconds(1500);
  j.cancel_requested = true;
  j.last_error = "timeout \xe2\x80\x94 upstream";
  j.fail_reason = core::FailReason::kPermanent;
  j.attempts = {
      {1, "worker-a", absl::FromUnixMicros(1700000001000000),
       absl::FromUnixMicros(1700000002000000), core::AttemptOutcome::kError, "boom"},
      {2, "worker-a", absl::FromUnixMicros(1700000003000000),
       absl::FromUnixMicros(1700000004000000), core::AttemptOutcome::kLeaseExpired, ""},
      {3, "worker-b", absl::FromUnixMicros(1700000004500000),
       absl::FromUnixMicros(1700000004600000), core::AttemptOutcome::kSnoozed, "snoozed for 1s"},
      {3, "worker-b", absl::FromUnixMicros(1700000005000000), absl::InfinitePast(),
       core::AttemptOutcome::kRunning, ""},
  };
  j.result = std::string("r\0s", 3);
  j.checkpoint = "step-2";
  j.completed_at = absl::FromUnixMicros(1700000009000001);
  j.timeout = absl::Minutes(3);
  j.timeout_at = absl::FromUnixMicros(1700000185000000);
  j.expire_at = absl::FromUnixMicros(1700003600000000);
  j.snoozes = 1;
  j.progress = R"({"percent": 40})";
  return j;
}

// A small, mostly default job.
inline core::Job SimpleJob(std::string id, std::string queue = "q", std::string payload = "p") {
  core::Job j;
  j.id = std::move(id);
  j.queue = std::move(queue);
  j.payload = std::move(payload);
  j.created_at = absl::FromUnixSeconds(1700000000);
  j.run_at = j.created_at;
  return j;
}

inline core::DedupEntry Dedup(std::string queue, std::string key, std::string job_id) {
  core::DedupEntry d;
  d.queue = std::move(queue);
  d.key = std::move(key);
  d.job_id = std::move(job_id);
  d.expires_at = absl::FromUnixSeconds(1700086400);
  d.payload_hash = core::PayloadHash(d.job_id);
  return d;
}

// Every field of PolicyOverride set, none to its QueuePolicy default.
// A schedule with every stored field set to something other than its default.
inline core::Schedule FullSchedule(std::string id = "nightly-\xff") {
  core::Schedule s;
  s.id = std::move(id);
  s.cron = "30 2 * * MON-FRI";
  s.time_zone = "Europe/Berlin";
  s.paused = true;
  s.start_at = absl::FromUnixSeconds(1'800'000'000);
  s.end_at = absl::FromUnixSeconds(1'900'000'000);
  s.catch_up = core::ScheduleCatchUp::kNone;
  s.created_at = absl::FromUnixMicros(1'799'999'999'123'456);
  s.next_run_at = absl::FromUnixSeconds(1'800'001'800);
  s.last_run_at = absl::FromUnixSeconds(1'800'000'000);
  s.last_job_id = "01JLASTJOB0000000000000000";
  s.job.queue = "reports";
  s.job.payload = std::string("{\"month\":1}\0\xff", 14);
  s.job.headers = {{"trace", "abc"}, {"empty", ""}};
  s.job.priority = -3;
  s.job.max_attempts = 7;
  s.job.lease_duration = absl::Seconds(45);
  s.job.concurrency_key = "tenant-1";
  s.job.timeout = absl::Minutes(10);
  return s;
}

inline core::PolicyOverride FullPolicy() {
  core::PolicyOverride p;
  p.max_concurrency = 4;
  p.max_concurrency_per_key = 1;
  p.max_attempts = 7;
  p.initial_backoff = absl::Milliseconds(250);
  p.backoff_multiplier = 1.5;
  p.max_backoff = absl::Minutes(2);
  p.jitter = core::Jitter::kEqual;
  p.lease_duration = absl::Seconds(90);
  p.dedup_ttl = absl::Hours(1);
  p.completed_max_count = 50;
  p.completed_max_age = absl::Hours(2);
  p.failed_max_count = 500;
  p.failed_max_age = absl::Hours(48);
  p.max_length = 100000;
  p.rate_per_second = 12.5;
  p.rate_burst = 20;
  p.paused = true;
  p.max_payload_bytes = 2 << 20;
  p.durability = core::Durability::kGroup;
  p.group_commit_delay = absl::Milliseconds(25);
  p.timeout = absl::Minutes(10);
  p.max_snoozes = 3;
  return p;
}

// Records what Recover reports, in order.
class RecordingVisitor final : public core::RecoveryVisitor {
 public:
  void OnAppliedSeq(uint64_t seq) override { applied_seq = seq; }
  void OnJob(core::Job job) override {
    events.push_back("job:" + job.id);
    jobs.push_back(std::move(job));
  }
  void OnDedup(core::DedupEntry entry) override {
    events.push_back("dedup:" + entry.queue + "/" + entry.key);
    dedup.push_back(std::move(entry));
  }
  void OnPolicy(std::string queue, core::PolicyOverride policy) override {
    events.push_back("policy:" + queue);
    policies.emplace_back(std::move(queue), std::move(policy));
  }
  void OnSchedule(core::Schedule schedule) override {
    events.push_back("schedule:" + schedule.id);
    schedules.push_back(std::move(schedule));
  }
  void OnCorrupt(core::CorruptRecord record) override {
    events.push_back(std::string("corrupt:") + core::RecordKindName(record.kind) + "/" +
                     record.key);
    corrupt.push_back(std::move(record));
  }

  std::vector<core::Job> jobs;
  std::vector<core::DedupEntry> dedup;
  std::vector<std::pair<std::string, core::PolicyOverride>> policies;
  std::vector<core::Schedule> schedules;
  std::vector<core::CorruptRecord> corrupt;
  std::vector<std::string> events;      // every record, in the order visited
  uint64_t applied_seq = ~uint64_t{0};  // not told
};

// A fresh directory under the test temp dir, removed when it goes out of scope.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    static int counter = 0;
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info != nullptr ? absl::StrCat(info->test_suite_name(), ".", info->name())
                                       : std::string("storage");
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("jobbroker-", name, "-", ::getpid(), "-", counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  // A path inside the directory that does not exist yet, for a store to create.
  std::string Sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace jobbroker::storage
