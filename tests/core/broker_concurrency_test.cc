// Many threads against one Broker in background commit mode: producers enqueue (alone, in
// batches, and racing on shared dedup keys), workers lease, heartbeat, ack and fail, readers call
// GetJob / ListJobs / GetQueue / ListQueues, and a ticker moves a FakeClock and calls Tick().
// The end state must add up: every job ended the way its payload asked, after exactly the
// attempts it asked for, each attempt delivered once, and a broker reopened over the same store
// recovers the same. The tsan preset runs this under ThreadSanitizer (tests/tsan/run.sh).
//
// Deterministic despite the threads: leases last 12 hours and the ticker only moves the clock
// while a retry is waiting (by 1 ms, a few ms per retry in all), so no lease can run out and no
// outcome depends on timing. Threads wait for each other through the broker's answers and an
// absl::Mutex, never by sleeping.

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/broker.h"
#include "core/clock.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::BlockingBroker;
using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::StatusIs;

namespace {

constexpr char kQueue[] = "work";
constexpr absl::Duration kLease = absl::Hours(12);
constexpr int kProducers = 3;
constexpr int kJobsPerProducer = 120;
constexpr int kSharedKeys = 20;  // every producer enqueues each of these under one dedup key
constexpr int kWorkers = 4;
constexpr int kReaders = 2;
constexpr int kTotalJobs = kProducers * kJobsPerProducer + kSharedKeys;

// What a worker does with a job, chosen by its payload.
enum class Kind { kAck, kRetryThenAck, kPermanent, kExhaust };

struct Expected {
  JobState state;
  int attempts;
  FailReason reason;
};

Kind KindOf(const std::string& payload) {
  if (absl::StartsWith(payload, "retry")) return Kind::kRetryThenAck;
  if (absl::StartsWith(payload, "permanent")) return Kind::kPermanent;
  if (absl::StartsWith(payload, "exhaust")) return Kind::kExhaust;
  return Kind::kAck;
}

Expected ExpectedFor(Kind kind) {
  switch (kind) {
    case Kind::kAck:
      return {JobState::kCompleted, 1, FailReason::kNone};
    case Kind::kRetryThenAck:
      return {JobState::kCompleted, 3, FailReason::kNone};
    case Kind::kPermanent:
      return {JobState::kFailed, 1, FailReason::kPermanent};
    case Kind::kExhaust:
      return {JobState::kFailed, 2, FailReason::kAttemptsExhausted};
  }
  return {};
}

EnqueueSpec SpecFor(int producer, int i) {
  EnqueueSpec s;
  s.queue = kQueue;
  s.lease_duration = kLease;
  s.priority = i % 3;
  switch (i % 4) {
    case 0:
      s.payload = absl::StrCat("ack-", producer, "-", i);
      break;
    case 1:
      s.payload = absl::StrCat("retry-", producer, "-", i);
      break;
    case 2:
      s.payload = absl::StrCat("permanent-", producer, "-", i);
      break;
    default:
      s.payload = absl::StrCat("exhaust-", producer, "-", i);
      s.max_attempts = 2;
      break;
  }
  return s;
}

EnqueueSpec SharedSpec(int key) {
  EnqueueSpec s;
  s.queue = kQueue;
  s.lease_duration = kLease;
  s.payload = absl::StrCat("ack-shared-", key);
  s.dedup_key = absl::StrCat("shared-", key);
  return s;
}

BrokerOptions Options() {
  BrokerOptions o;
  o.commit_mode = CommitPipeline::Mode::kBackground;
  o.uniform = [] { return 0.5; };
  // Keep every ended job, so that readers and the final check can still find it.
  o.default_policy.completed_max_count = 0;
  o.default_policy.completed_max_age = absl::ZeroDuration();
  o.default_policy.failed_max_count = 0;
  o.default_policy.failed_max_age = absl::ZeroDuration();
  return o;
}

// Runs a long-poll Lease and waits for its answer.
absl::StatusOr<std::vector<LeasedJob>> LongPoll(BlockingBroker& broker, const std::string& worker) {
  absl::Notification answered;
  absl::StatusOr<std::vector<LeasedJob>> out;
  broker.Lease(LeaseSpec{kQueue, worker, 3, absl::ZeroDuration()}, absl::Seconds(30),
               [&](absl::StatusOr<std::vector<LeasedJob>> r) {
                 out = std::move(r);
                 answered.Notify();
               });
  answered.WaitForNotification();
  return out;
}

class Workload {
 public:
  Workload(BlockingBroker& broker, FakeClock& clock) : broker_(broker), clock_(clock) {}

  // Runs every thread to the end. Returns each job's id with what was enqueued under it.
  std::map<std::string, Kind> Run() {
    std::vector<std::thread> threads;
    std::atomic<bool> stop_readers{false};
    threads.emplace_back([&] { Ticker(stop_readers); });
    for (int r = 0; r < kReaders; ++r) threads.emplace_back([&] { Reader(stop_readers); });
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) workers.emplace_back([this, w] { Worker(w); });
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) producers.emplace_back([this, p] { Producer(p); });

    for (std::thread& t : producers) t.join();
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Workload::DoneLocked));
    }
    // Long polls still waiting answer empty; their workers see that every job has ended.
    broker_.Shutdown();
    for (std::thread& t : workers) t.join();
    stop_readers.store(true);
    for (std::thread& t : threads) t.join();

    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(failed_);
    EXPECT_EQ(ended_, kTotalJobs);
    return enqueued_;
  }

  // (job, attempt) pairs delivered more than once; each must be delivered exactly once.
  int duplicate_deliveries() {
    absl::MutexLock lock(&mu_);
    return duplicate_deliveries_;
  }
  // Every shared dedup key's enqueues: one created the job, the others got its id back.
  void CheckDedup() {
    absl::MutexLock lock(&mu_);
    for (int k = 0; k < kSharedKeys; ++k) {
      const auto& ids = shared_ids_[k];
      ASSERT_EQ(ids.size(), size_t{kProducers}) << "shared key " << k;
      EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u) << "shared key " << k;
      EXPECT_EQ(shared_created_[k], 1)
          << "shared key " << k << ": created once, deduplicated after";
    }
  }

 private:
  // A thread that meets an unexpected answer records the failure and stops; this ends the run
  // instead of leaving the others waiting for jobs that will never end.
  void Abandon() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ == kTotalJobs || failed_;
  }

  void Producer(int p) {
    int i = 0;
    int batch = 1;
    int shared = 0;
    while (i < kJobsPerProducer) {
      std::vector<EnqueueSpec> specs;
      for (int b = 0; b < batch && i < kJobsPerProducer; ++b, ++i) specs.push_back(SpecFor(p, i));
      std::vector<std::string> payloads;
      for (const EnqueueSpec& s : specs) payloads.push_back(s.payload);
      auto results = broker_.EnqueueBatch(std::move(specs));
      if (!results.ok() || results->size() != payloads.size()) {
        ADD_FAILURE() << "producer " << p << ": " << results.status();
        return Abandon();
      }
      {
        absl::MutexLock lock(&mu_);
        for (size_t r = 0; r < payloads.size(); ++r) {
          EXPECT_FALSE((*results)[r].deduplicated);
          EXPECT_TRUE(enqueued_.emplace((*results)[r].job_id, KindOf(payloads[r])).second)
              << "job id handed out twice: " << (*results)[r].job_id;
          published_.push_back((*results)[r].job_id);
        }
      }
      batch = batch % 5 + 1;
      // One shared key after each batch, each producer starting at another key, so producers
      // race on them while jobs are being worked.
      if (shared < kSharedKeys && !EnqueueShared((shared++ + 7 * p) % kSharedKeys)) return;
    }
    while (shared < kSharedKeys) {
      if (!EnqueueShared((shared++ + 7 * p) % kSharedKeys)) return;
    }
  }

  bool EnqueueShared(int key) {
    auto r = broker_.Enqueue(SharedSpec(key));
    if (!r.ok()) {
      ADD_FAILURE() << "shared key " << key << ": " << r.status();
      Abandon();
      return false;
    }
    absl::MutexLock lock(&mu_);
    shared_ids_[key].push_back(r->job_id);
    if (!r->deduplicated) {
      ++shared_created_[key];
      enqueued_.emplace(r->job_id, Kind::kAck);
      published_.push_back(r->job_id);
    }
    return true;
  }

  void Worker(int w) {
    const std::string name = absl::StrCat("worker-", w);
    const bool long_poll = w % 2 == 0;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (DoneLocked()) return;
      }
      absl::StatusOr<std::vector<LeasedJob>> leased =
          long_poll ? LongPoll(broker_, name)
                    : broker_.Lease(LeaseSpec{kQueue, name, 2, absl::ZeroDuration()});
      if (!leased.ok()) {
        // Only Shutdown refuses, and it comes after the last job ended.
        if (leased.status().code() == absl::StatusCode::kUnavailable) continue;
        ADD_FAILURE() << name << ": " << leased.status();
        return Abandon();
      }
      if (leased->empty()) std::this_thread::yield();
      for (const LeasedJob& job : *leased) {
        if (!Work(name, job)) return Abandon();
      }
    }
  }

  // False after an unexpected answer (recorded as a test failure).
  bool Work(const std::string& worker, const LeasedJob& job) {
    {
      absl::MutexLock lock(&mu_);
      if (!delivered_[job.job_id].insert(job.attempt).second) ++duplicate_deliveries_;
    }
    EXPECT_EQ(job.queue, kQueue);
    auto hb = broker_.Heartbeat(HeartbeatSpec{job.job_id, job.lease_id, absl::ZeroDuration(),
                                              absl::StrCat("attempt-", job.attempt)});
    if (!hb.ok()) {
      ADD_FAILURE() << worker << " heartbeat " << job.job_id << ": " << hb.status();
      return false;
    }
    EXPECT_FALSE(hb->cancel_requested);

    const Kind kind = KindOf(job.payload);
    const Expected want = ExpectedFor(kind);
    EXPECT_LE(job.attempt, want.attempts) << job.job_id << " was leased after it should have ended";
    bool ended = false;
    if (kind == Kind::kAck || (kind == Kind::kRetryThenAck && job.attempt == want.attempts)) {
      absl::Status acked =
          broker_.Ack(AckSpec{job.job_id, job.lease_id, absl::StrCat("done-", job.job_id)});
      if (!acked.ok()) {
        ADD_FAILURE() << worker << " ack " << job.job_id << ": " << acked;
        return false;
      }
      ended = true;
    } else {
      // Retries alternate between due at once and due a little later (the ticker's business).
      const absl::Duration retry_after =
          job.attempt % 2 == 1 ? absl::ZeroDuration() : absl::Milliseconds(3);
      auto failed = broker_.Fail(FailSpec{job.job_id, job.lease_id,
                                          absl::StrCat("attempt ", job.attempt, " failed"),
                                          kind == Kind::kPermanent, retry_after});
      if (!failed.ok()) {
        ADD_FAILURE() << worker << " fail " << job.job_id << ": " << failed.status();
        return false;
      }
      ended = job.attempt == want.attempts;
      if (ended) {
        EXPECT_EQ(failed->state, JobState::kFailed) << job.job_id << " attempt " << job.attempt;
      } else if (retry_after > absl::ZeroDuration()) {
        EXPECT_EQ(failed->state, JobState::kScheduled) << job.job_id;
        // Due retry_after after the Fail, which came between the heartbeat and now.
        EXPECT_GE(failed->next_attempt_at, hb->lease_deadline - kLease + retry_after) << job.job_id;
        EXPECT_LE(failed->next_attempt_at, clock_.Now() + retry_after) << job.job_id;
      } else {
        // Due at once: READY, also when a waiting long poll takes it in the same transition
        // (the answer says what the Fail did, not what happened to the job next).
        EXPECT_EQ(failed->state, JobState::kReady) << job.job_id;
      }
    }
    if (ended) {
      absl::MutexLock lock(&mu_);
      ++ended_;
    }
    return true;
  }

  // Reads while everything moves: what a read returns must be consistent, and a job seen ended
  // stays ended.
  void Reader(const std::atomic<bool>& stop) {
    absl::flat_hash_map<std::string, JobState> seen_ended;
    size_t next = 0;
    while (!stop.load()) {
      std::string id;
      {
        absl::MutexLock lock(&mu_);
        if (!published_.empty()) id = published_[next++ % published_.size()];
      }
      if (!id.empty()) {
        auto job = broker_.GetJob(id);
        if (!job.ok()) {
          ADD_FAILURE() << "GetJob " << id << ": " << job.status();
          return Abandon();
        }
        EXPECT_EQ(job->id, id);
        if (auto it = seen_ended.find(id); it != seen_ended.end()) {
          EXPECT_EQ(job->state, it->second) << id << " changed after it ended";
        } else if (IsTerminal(job->state)) {
          seen_ended.emplace(id, job->state);
        }
      }
      auto info = broker_.GetQueue(kQueue);
      if (info.ok()) {
        int64_t sum = 0;
        for (const auto& [state, n] : info->counts) {
          EXPECT_GE(n, 0);
          sum += n;
        }
        EXPECT_LE(sum, kTotalJobs);
        EXPECT_EQ(info->active, info->counts[JobState::kActive]);
      } else {
        EXPECT_THAT(info, StatusIs(absl::StatusCode::kNotFound)) << info.status();
      }
      ListJobsSpec list;
      list.queue = kQueue;
      list.page_size = 50;
      list.newest_first = next % 2 == 0;
      absl::flat_hash_set<std::string> listed;
      while (true) {
        auto page = broker_.ListJobs(list);
        if (!page.ok()) {
          EXPECT_THAT(page, StatusIs(absl::StatusCode::kNotFound)) << page.status();
          break;
        }
        for (const Job& j : page->jobs) {
          EXPECT_EQ(j.queue, kQueue);
          EXPECT_TRUE(listed.insert(j.id).second) << j.id << " listed twice in one walk";
        }
        if (page->next_page_token.empty()) break;
        list.page_token = page->next_page_token;
      }
      EXPECT_LE(listed.size(), size_t{kTotalJobs});
      for (const QueueInfo& q : broker_.ListQueues()) EXPECT_EQ(q.name, kQueue);
    }
  }

  // Moves the clock only while a retry waits for it, so that leases never run out.
  void Ticker(const std::atomic<bool>& stop) {
    while (!stop.load()) {
      auto info = broker_.GetQueue(kQueue);
      if (info.ok() && info->counts[JobState::kScheduled] > 0)
        clock_.Advance(absl::Milliseconds(1));
      broker_.Tick();
      std::this_thread::yield();
    }
  }

  BlockingBroker& broker_;
  FakeClock& clock_;
  absl::Mutex mu_;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;  // jobs a worker saw end
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Kind> enqueued_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> published_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<int>> delivered_ ABSL_GUARDED_BY(mu_);
  int duplicate_deliveries_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::vector<std::string>> shared_ids_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> shared_created_ ABSL_GUARDED_BY(mu_);
};

// Every job ended as its kind says, and the queue's counts say the same.
void CheckEndState(BlockingBroker& broker, const std::map<std::string, Kind>& jobs) {
  ASSERT_EQ(jobs.size(), size_t{kTotalJobs});
  std::map<JobState, int64_t> want_counts;
  for (const auto& [id, kind] : jobs) {
    const Expected want = ExpectedFor(kind);
    ++want_counts[want.state];
    auto job = broker.GetJob(id);
    ASSERT_TRUE(job.ok()) << id << ": " << job.status();
    EXPECT_EQ(job->state, want.state) << id;
    EXPECT_EQ(job->attempt, want.attempts) << id;
    EXPECT_EQ(job->fail_reason, want.reason) << id;
    EXPECT_EQ(job->attempts.size(), size_t(want.attempts)) << id;
    EXPECT_EQ(job->checkpoint, absl::StrCat("attempt-", want.attempts)) << id;
    if (want.state == JobState::kCompleted) {
      EXPECT_EQ(job->result, absl::StrCat("done-", id));
    }
  }
  auto info = broker.GetQueue(kQueue);
  ASSERT_TRUE(info.ok()) << info.status();
  for (JobState s : {JobState::kReady, JobState::kScheduled, JobState::kActive,
                     JobState::kCompleted, JobState::kFailed, JobState::kCancelled}) {
    EXPECT_EQ(info->counts[s], want_counts[s]) << JobStateName(s);
  }
  // A walk over every page finds each job exactly once.
  std::set<std::string> listed;
  ListJobsSpec list;
  list.queue = kQueue;
  list.page_size = 64;
  while (true) {
    auto page = broker.ListJobs(list);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const Job& j : page->jobs) EXPECT_TRUE(listed.insert(j.id).second) << j.id;
    if (page->next_page_token.empty()) break;
    list.page_token = page->next_page_token;
  }
  std::set<std::string> want_ids;
  for (const auto& [id, kind] : jobs) want_ids.insert(id);
  EXPECT_EQ(listed, want_ids);
}

// Runs the workload over `store`, checks it, and returns the jobs for a recovery check.
std::map<std::string, Kind> RunAndCheck(Store& store, FakeClock& clock) {
  auto opened = BlockingBroker::Open(store, clock, Options());
  EXPECT_TRUE(opened.ok()) << opened.status();
  if (!opened.ok()) return {};
  BlockingBroker& broker = **opened;
  Workload load(broker, clock);
  std::map<std::string, Kind> jobs = load.Run();
  EXPECT_EQ(load.duplicate_deliveries(), 0);
  load.CheckDedup();
  EXPECT_TRUE(broker.Flush().ok());
  CheckEndState(broker, jobs);
  return jobs;
}

TEST(BrokerConcurrencyTest, MemoryStoreEndStateAddsUp) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  storage::MemoryStore store;
  std::map<std::string, Kind> jobs = RunAndCheck(store, clock);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(store.job_count(), size_t{kTotalJobs});

  // What was acknowledged is what the store holds: a new broker recovers the same end state.
  auto reopened = BlockingBroker::Open(store, clock, Options());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  CheckEndState(**reopened, jobs);
}

TEST(BrokerConcurrencyTest, RocksDbStoreEndStateAddsUpAndSurvivesReopen) {
  storage::ScopedTempDir dir;
  const std::string path = dir.Sub("db");
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  std::map<std::string, Kind> jobs;
  {
    auto store = storage::RocksDbStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    jobs = RunAndCheck(**store, clock);
    ASSERT_FALSE(HasFatalFailure());
  }
  auto store = storage::RocksDbStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto reopened = BlockingBroker::Open(**store, clock, Options());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  CheckEndState(**reopened, jobs);
}

}  // namespace
}  // namespace jobbroker::core
