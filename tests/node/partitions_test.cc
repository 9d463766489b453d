// node::Partitions: queues spread over partitions, job ids routing back to theirs, and what is
// different when a call spans partitions (batches, Work streams, ack batches, listings, a
// storage failure that stops them all).
#include "node/partitions.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "storage/rocksdb_store.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/recording_sink.h"
#include "tests/testing/recording_watcher.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::node {
namespace {

using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::RecordingSink;
using ::jobbroker::testing::RecordingWatcher;
using ::jobbroker::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using Code = absl::StatusCode;
using BlockingPartitions = ::jobbroker::testing::BlockingEngine<Partitions>;

constexpr uint32_t kPartitions = 4;

// The first name "<prefix><n>" whose queue lives in `partition`.
std::string QueueIn(uint32_t partition, const std::string& prefix = "q") {
  for (int n = 0;; ++n) {
    std::string name = prefix + std::to_string(n);
    if (core::PartitionOfQueue(name, kPartitions) == partition) return name;
  }
}

class PartitionsTest : public ::testing::Test {
 protected:
  PartitionsTest() : clock_(absl::FromUnixSeconds(1'800'000'000)) { Open(); }

  void Open(core::BrokerOptions options = {}) {
    partitions_.reset();
    options.commit_mode = core::CommitPipeline::Mode::kInline;
    options.uniform = [] { return 0.5; };
    auto opened = BlockingPartitions::Open(store_, clock_, kPartitions, options);
    ASSERT_THAT(opened, IsOk());
    partitions_ = *std::move(opened);
  }

  std::string Enqueue(const std::string& queue) {
    absl::StatusOr<core::EnqueueResult> r = partitions_->Enqueue({.queue = queue});
    EXPECT_THAT(r, IsOk());
    return r.ok() ? r->job_id : "";
  }

  uint64_t Subscribe(std::shared_ptr<RecordingSink> sink, std::vector<std::string> queues,
                     int max_in_flight) {
    absl::StatusOr<uint64_t> id = partitions_->Subscribe(
        core::SubscribeSpec{std::move(queues), "w", max_in_flight}, std::move(sink));
    EXPECT_THAT(id, IsOk());
    return id.ok() ? *id : 0;
  }

  void Ack(const core::LeasedJob& job) {
    ASSERT_THAT(partitions_->Ack({job.job_id, job.lease_id, ""}), IsOk());
  }

  FakeClock clock_;
  testing::FaultyStore store_;
  std::unique_ptr<BlockingPartitions> partitions_;
};

TEST_F(PartitionsTest, AJobLivesInItsQueuesPartitionAndItsIdSaysWhich) {
  for (uint32_t p = 0; p < kPartitions; ++p) {
    const std::string queue = QueueIn(p);
    const std::string id = Enqueue(queue);
    EXPECT_EQ(core::PartitionOfJobId(id, kPartitions), p) << id;
    EXPECT_EQ(partitions_->broker().broker(p).GetQueue(queue)->counts[core::JobState::kReady], 1);
    for (uint32_t other = 0; other < kPartitions; ++other) {
      if (other == p) continue;
      EXPECT_THAT(partitions_->broker().broker(other).GetJob(id), StatusIs(Code::kNotFound));
    }
    // Every job-scoped call finds it through the id alone.
    EXPECT_EQ(partitions_->GetJob(id)->queue, queue);
    EXPECT_EQ(*partitions_->JobQueue(id), queue);
    EXPECT_EQ(partitions_->GetQueue(queue)->partition, p);
  }
}

TEST_F(PartitionsTest, EveryJobScopedCallReachesItsPartition) {
  const std::string queue = QueueIn(3);
  Enqueue(queue);
  absl::StatusOr<std::vector<core::LeasedJob>> leased =
      partitions_->Lease({.queue = queue, .worker_id = "w"});
  ASSERT_THAT(leased, IsOk());
  ASSERT_THAT(*leased, SizeIs(1));
  const core::LeasedJob& job = leased->front();
  EXPECT_THAT(partitions_->Heartbeat({.job_id = job.job_id, .lease_id = job.lease_id}), IsOk());
  absl::StatusOr<core::FailResult> failed =
      partitions_->Fail({.job_id = job.job_id, .lease_id = job.lease_id, .error = "boom"});
  ASSERT_THAT(failed, IsOk());
  EXPECT_EQ(failed->state, core::JobState::kScheduled);
  EXPECT_EQ(partitions_->CancelJob(job.job_id)->state, core::JobState::kCancelled);
  EXPECT_EQ(partitions_->RetryJob(job.job_id)->state, core::JobState::kReady);
  ASSERT_THAT(partitions_->CancelJob(job.job_id), IsOk());
  EXPECT_THAT(partitions_->DeleteJob(job.job_id), IsOk());
  EXPECT_THAT(partitions_->GetJob(job.job_id), StatusIs(Code::kNotFound));
}

TEST_F(PartitionsTest, AnIdNotOfTheBrokersFormIsAnsweredAsAnUnknownJob) {
  EXPECT_THAT(partitions_->GetJob("not-a-job-id"), StatusIs(Code::kNotFound));
  EXPECT_THAT(partitions_->Ack({"not-a-job-id", "1-00", ""}), StatusIs(Code::kNotFound));
}

TEST_F(PartitionsTest, ABatchWithinOnePartitionIsEnqueuedWhole) {
  const std::string a = QueueIn(1, "a");
  const std::string b = QueueIn(1, "b");
  absl::StatusOr<std::vector<core::EnqueueResult>> r =
      partitions_->EnqueueBatch({{.queue = a}, {.queue = b}, {.queue = a}});
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(*r, SizeIs(3));
}

TEST_F(PartitionsTest, ABatchSpanningPartitionsIsRefusedNamingThemAndChangesNothing) {
  const std::string a = QueueIn(0, "a");
  const std::string b = QueueIn(2, "b");
  const int64_t writes = store_.successful_writes();
  absl::StatusOr<std::vector<core::EnqueueResult>> r =
      partitions_->EnqueueBatch({{.queue = a}, {.queue = b}});
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(r.status().message(),
              HasSubstr("spans partitions 0 (queue " + a + "), 2 (queue " + b + ")"));
  EXPECT_EQ(store_.successful_writes(), writes);
  EXPECT_THAT(partitions_->ListQueues(), SizeIs(0));
  EXPECT_THAT(partitions_->broker().broker(0).GetQueue(a), StatusIs(Code::kNotFound));

  // A field error still comes first: it says what to fix.
  r = partitions_->EnqueueBatch({{.queue = a}, {.queue = "no spaces"}});
  EXPECT_THAT(r, StatusIs(Code::kInvalidArgument, HasSubstr("jobs[1].queue")));
}

TEST_F(PartitionsTest, ListQueuesListsEveryPartitionsQueuesOnceByName) {
  core::BrokerOptions options;
  for (uint32_t p = 0; p < kPartitions; ++p) options.queue_policies[QueueIn(p, "conf")] = {};
  Open(options);
  Enqueue(QueueIn(2, "z"));
  Enqueue(QueueIn(0, "a"));
  std::vector<std::string> names;
  for (const core::QueueInfo& q : partitions_->ListQueues()) names.push_back(q.name);
  std::vector<std::string> want = {QueueIn(0, "a"), QueueIn(2, "z")};
  for (uint32_t p = 0; p < kPartitions; ++p) want.push_back(QueueIn(p, "conf"));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want) << "each configured queue once, by its own partition";
}

TEST_F(PartitionsTest, ALongPollWaitsInItsPartitionAndCanBeCancelled) {
  const std::string queue = QueueIn(3);
  absl::Notification answered;
  absl::StatusOr<std::vector<core::LeasedJob>> answer;
  const uint64_t waiter = partitions_->Lease({.queue = queue, .worker_id = "w"}, absl::Seconds(30),
                                             [&](absl::StatusOr<std::vector<core::LeasedJob>> r) {
                                               answer = std::move(r);
                                               answered.Notify();
                                             });
  ASSERT_NE(waiter, 0u);
  EXPECT_FALSE(answered.HasBeenNotified());
  EXPECT_TRUE(partitions_->CancelWait(waiter));
  ASSERT_TRUE(answered.HasBeenNotified());
  EXPECT_THAT(answer, StatusIs(Code::kCancelled));
  EXPECT_FALSE(partitions_->CancelWait(waiter)) << "answered already";
  EXPECT_FALSE(partitions_->CancelWait(0));
}

TEST_F(PartitionsTest, AWorkStreamOverSeveralPartitionsHoldsAtMostMaxInFlightJobsInAll) {
  const std::vector<std::string> queues = {QueueIn(0), QueueIn(1), QueueIn(2)};
  for (const std::string& q : queues)
    for (int i = 0; i < 3; ++i) Enqueue(q);
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, queues, 2);
  ASSERT_THAT(sink->jobs(), SizeIs(2)) << "not 2 per partition";

  // Each ack frees one slot, which any partition may fill; nine jobs go through two at a time.
  std::set<std::string> seen;
  for (int acked = 0; acked < 9; ++acked) {
    std::vector<core::LeasedJob> held = sink->jobs();
    const int open = static_cast<int>(held.size()) - acked;
    ASSERT_LE(open, 2) << "after " << acked << " acks";
    ASSERT_GE(open, 1) << "a slot was free and jobs were waiting";
    const core::LeasedJob& next = held[acked];
    EXPECT_TRUE(seen.insert(next.job_id).second);
    Ack(next);
  }
  EXPECT_THAT(sink->jobs(), SizeIs(9));
  for (const std::string& q : queues)
    EXPECT_EQ(partitions_->GetQueue(q)->counts[core::JobState::kCompleted], 3);
}

TEST_F(PartitionsTest, AStarvedPartitionGetsTheSlotThatAnotherPartitionsAckFrees) {
  const std::string busy = QueueIn(0);
  const std::string starved = QueueIn(3);
  Enqueue(busy);
  auto sink = std::make_shared<RecordingSink>();
  Subscribe(sink, {busy, starved}, 1);
  ASSERT_THAT(sink->jobs(), SizeIs(1));
  Enqueue(starved);  // the budget is spent: partition 3 may not push it
  ASSERT_THAT(sink->jobs(), SizeIs(1));
  Ack(sink->jobs()[0]);  // partition 0 gives the slot back; partition 3 is refilled
  ASSERT_THAT(sink->jobs(), SizeIs(2));
  EXPECT_EQ(sink->jobs()[1].queue, starved);
}

TEST_F(PartitionsTest, FlowControlOfASpanningStreamSetsItsWholeBudget) {
  const std::vector<std::string> queues = {QueueIn(1), QueueIn(2)};
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t stream = Subscribe(sink, queues, 1);
  ASSERT_THAT(partitions_->SetFlow(stream, 0), IsOk());  // drained
  for (const std::string& q : queues)
    for (int i = 0; i < 3; ++i) Enqueue(q);
  EXPECT_THAT(sink->jobs(), SizeIs(0));
  ASSERT_THAT(partitions_->SetFlow(stream, 4), IsOk());
  EXPECT_THAT(sink->jobs(), SizeIs(4));
  EXPECT_THAT(partitions_->SetFlow(stream + 100, 1), StatusIs(Code::kNotFound));
  EXPECT_THAT(partitions_->SetFlow(stream, -1), StatusIs(Code::kInvalidArgument));

  partitions_->Unsubscribe(stream);
  Ack(sink->jobs()[0]);
  EXPECT_THAT(sink->jobs(), SizeIs(4)) << "no pushes after the stream ended";
}

TEST_F(PartitionsTest, AnAckBatchAcrossPartitionsAppliesEachInItsOwnAndAnswersInOrder) {
  const std::string a = QueueIn(0);
  const std::string b = QueueIn(2);
  Enqueue(a);
  Enqueue(b);
  Enqueue(a);
  std::vector<core::LeasedJob> jobs =
      *partitions_->Lease({.queue = a, .worker_id = "w", .max_jobs = 2});
  jobs.push_back(partitions_->Lease({.queue = b, .worker_id = "w"})->front());
  ASSERT_THAT(jobs, SizeIs(3));
  absl::StatusOr<std::vector<absl::Status>> r = partitions_->AckBatch({
      {jobs[2].job_id, jobs[2].lease_id, ""},      // partition 2
      {jobs[0].job_id, "1-0000000000000000", ""},  // partition 0, a stale lease
      {jobs[1].job_id, jobs[1].lease_id, ""},      // partition 0
  });
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT(*r, SizeIs(3));
  EXPECT_THAT((*r)[0], IsOk());
  EXPECT_THAT((*r)[1], StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT((*r)[2], IsOk());
  EXPECT_EQ(partitions_->GetJob(jobs[2].job_id)->state, core::JobState::kCompleted);
  EXPECT_EQ(partitions_->GetJob(jobs[0].job_id)->state, core::JobState::kActive);

  // A malformed item refuses the whole call, whichever partition it is for.
  EXPECT_THAT(partitions_->AckBatch({{jobs[0].job_id, jobs[0].lease_id, ""}, {"", "", ""}}),
              StatusIs(Code::kInvalidArgument, HasSubstr("acks[1]")));
  EXPECT_EQ(partitions_->GetJob(jobs[0].job_id)->state, core::JobState::kActive);
}

TEST_F(PartitionsTest, TheMemoryBoundIsTheNodesSharedOutOverPartitions) {
  core::BrokerOptions options;
  options.max_hot_jobs = 4;  // one whole job per partition
  Open(options);
  for (uint32_t p = 0; p < kPartitions; ++p)
    for (int i = 0; i < 3; ++i) Enqueue(QueueIn(p));
  partitions_->Tick();
  core::Broker::MemoryCounts held = partitions_->memory_counts();
  EXPECT_EQ(held.hot_jobs + held.cold_jobs, 12);
  EXPECT_LE(held.hot_jobs, 4);
}

// The bug this guards against: partitions share one pipeline, so a failed write may have held
// any partition's changes. The first partition to resume resets the pipeline; another partition
// whose memory still holds a lost change must not write on top of it.
TEST_F(PartitionsTest, AfterAStorageFailureEveryPartitionRebuildsBeforeItWritesAgain) {
  const std::string first = QueueIn(0);
  const std::string other = QueueIn(1);
  store_.FailWritesAfter(0);
  EXPECT_THAT(partitions_->Enqueue({.queue = other}), StatusIs(Code::kUnavailable));
  EXPECT_THAT(partitions_->Enqueue({.queue = first}), StatusIs(Code::kUnavailable))
      << "one pipeline: every partition stops";
  // Partition 1's memory holds the enqueue the store never took.
  ASSERT_EQ(partitions_->GetQueue(other)->counts[core::JobState::kReady], 1);

  store_.FailWritesAfter(-1);
  ASSERT_THAT(partitions_->broker().broker(0).ResumeWrites(), IsOk());
  EXPECT_THAT(partitions_->Enqueue({.queue = first}), IsOk());
  EXPECT_THAT(partitions_->Enqueue({.queue = other}),
              StatusIs(Code::kUnavailable, HasSubstr("partition 1 is rebuilding")));

  partitions_->Tick();  // each partition's tick rebuilds it (no retry interval to wait for)
  EXPECT_THAT(partitions_->GetQueue(other), StatusIs(Code::kNotFound))
      << "the lost enqueue (the queue's only job) is gone from memory too";
  EXPECT_THAT(partitions_->Enqueue({.queue = other}), IsOk());
  EXPECT_THAT(partitions_->storage_status(), IsOk());
}

// Producers on threads of their own and one stream over every partition, as in the server (the
// background writer; also run under ThreadSanitizer): every job is pushed once and completes.
TEST(PartitionsConcurrencyTest, ProducersAndAStreamAcrossPartitionsCompleteEveryJobOnce) {
  constexpr int kProducers = 4;
  constexpr int kJobsEach = 150;
  storage::MemoryStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  core::BrokerOptions options;
  options.commit_mode = core::CommitPipeline::Mode::kBackground;
  auto opened = BlockingPartitions::Open(store, clock, kPartitions, options);
  ASSERT_THAT(opened, IsOk());
  BlockingPartitions& partitions = **opened;
  std::vector<std::string> queues;
  for (uint32_t p = 0; p < kPartitions; ++p) queues.push_back(QueueIn(p));

  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT(partitions.Subscribe(core::SubscribeSpec{queues, "w", 3}, sink), IsOk());
  std::vector<std::thread> producers;
  for (int t = 0; t < kProducers; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kJobsEach; ++i)
        EXPECT_THAT(partitions.Enqueue({.queue = queues[(t + i) % queues.size()]}), IsOk());
    });
  }
  // The worker: acks what it was pushed, in order, until every job has come.
  std::set<std::string> acked;
  const absl::Time give_up = absl::Now() + absl::Minutes(2);  // a hang fails, never a slow run
  while (acked.size() < kProducers * kJobsEach && absl::Now() < give_up) {
    std::vector<core::LeasedJob> pushed = sink->jobs();
    if (pushed.size() == acked.size()) {
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    ASSERT_LE(pushed.size() - acked.size(), 3u) << "more than max_in_flight held";
    const core::LeasedJob& next = pushed[acked.size()];
    ASSERT_TRUE(acked.insert(next.job_id).second) << "pushed twice: " << next.job_id;
    ASSERT_THAT(partitions.Ack({next.job_id, next.lease_id, ""}), IsOk());
  }
  for (std::thread& t : producers) t.join();
  EXPECT_EQ(acked.size(), size_t{kProducers * kJobsEach});
  for (const std::string& q : queues) {
    EXPECT_EQ(partitions.GetQueue(q)->counts[core::JobState::kCompleted],
              kProducers * kJobsEach / kPartitions);
  }
}

TEST_F(PartitionsTest, APartitionWhoseOwnRetryFailedRebuildsAtOnceWhenAnotherResumed) {
  store_.FailWritesAfter(0);
  EXPECT_THAT(partitions_->Enqueue({.queue = QueueIn(2)}), StatusIs(Code::kUnavailable));
  clock_.Advance(absl::Seconds(1));
  partitions_->Tick();  // every partition tries the store, fails, and plans its next try in 1 s
  EXPECT_THAT(partitions_->storage_status(), StatusIs(Code::kUnavailable));

  store_.FailWritesAfter(-1);
  ASSERT_THAT(partitions_->broker().broker(0).ResumeWrites(), IsOk());
  partitions_->Tick();  // no time has passed: the others rebuild without waiting for their try
  for (uint32_t p = 0; p < kPartitions; ++p)
    EXPECT_THAT(partitions_->Enqueue({.queue = QueueIn(p)}), IsOk()) << "partition " << p;
}

TEST(PartitionsOpenTest, ACountOutOfRangeIsRefused) {
  storage::MemoryStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  EXPECT_THAT(Partitions::Open(store, clock, 0, {}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Partitions::Open(store, clock, core::kMaxPartitions + 1, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("partitions is 32769")));
}

// Cluster mode's layout: a store and a pipeline per partition, each halted until it resumes.
class PartitionsOpenEachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<core::Store*> borrowed;
    for (uint32_t p = 0; p < kPartitions; ++p) {
      stores_.push_back(std::make_unique<testing::FaultyStore>());
      borrowed.push_back(stores_.back().get());
    }
    core::BrokerOptions options;
    options.commit_mode = core::CommitPipeline::Mode::kInline;
    auto opened = BlockingPartitions::Open(borrowed, clock_, options);
    ASSERT_THAT(opened, IsOk());
    partitions_ = *std::move(opened);
  }

  FakeClock clock_{absl::FromUnixSeconds(1'800'000'000)};
  std::vector<std::unique_ptr<testing::FaultyStore>> stores_;
  std::unique_ptr<BlockingPartitions> partitions_;
};

// Halting one partition (its node stopped leading it) refuses its changes with the cause and leaves
// the others writing; its ResumeWrites brings it back with what its store holds.
TEST_F(PartitionsOpenEachTest, HaltingOnePartitionStopsItAloneUntilItResumes) {
  BlockingPartitions& partitions = *partitions_;
  std::vector<std::unique_ptr<testing::FaultyStore>>& stores = stores_;
  ASSERT_EQ(partitions.broker().count(), kPartitions);
  // No partition writes before its node leads it.
  EXPECT_THAT(partitions.Enqueue({.queue = QueueIn(1)}),
              StatusIs(Code::kUnavailable, HasSubstr("partition 1 has no leader yet")));
  EXPECT_THAT(partitions.Enqueue({.queue = QueueIn(1)}).status().message(),
              ::testing::Not(HasSubstr("storage")))
      << "not a storage failure: said as it is";
  EXPECT_EQ(stores[1]->successful_writes(), 0) << "not even the broker's opening commit";
  ASSERT_THAT(partitions.broker().ResumeWrites(), IsOk());
  const std::string kept = partitions.Enqueue({.queue = QueueIn(1)})->job_id;
  EXPECT_THAT(stores[1]->ReadJob(1, kept), IsOk()) << "partition 1 writes to its own store";
  EXPECT_THAT(stores[0]->ReadJob(1, kept), StatusIs(Code::kNotFound));

  partitions.broker().HaltWrites(1,
                                 absl::UnavailableError("partition 1: node a no longer leads it"));
  EXPECT_THAT(partitions.Enqueue({.queue = QueueIn(1)}),
              StatusIs(Code::kUnavailable, HasSubstr("no longer leads it")));
  EXPECT_THAT(partitions.broker().storage_status(), StatusIs(Code::kUnavailable));
  for (uint32_t p : {0u, 2u, 3u})
    EXPECT_THAT(partitions.Enqueue({.queue = QueueIn(p)}), IsOk()) << "partition " << p;

  ASSERT_THAT(partitions.broker().broker(1).ResumeWrites(), IsOk());
  EXPECT_EQ(partitions.GetJob(kept)->queue, QueueIn(1)) << "rebuilt from its store";
  EXPECT_THAT(partitions.Enqueue({.queue = QueueIn(1)}), IsOk());
  EXPECT_THAT(partitions.broker().storage_status(), IsOk());
}

// A partition this node stops leading changes elsewhere from then on: a watch of one of its jobs
// (Admin.WatchJob, or the dependency relay's) ends at once with the cause, so that it is opened
// again at the new leader, instead of waiting for ever on a broker that will not change the job.
// Jepsen seed 1109040273 left a job WAITING for good: its node's relay watched the dependency in
// a partition that the node then handed back to its preferred replica.
TEST_F(PartitionsOpenEachTest, WatchesOfAPartitionThatStopsBeingLedEndAndNewOnesAreRefused) {
  BlockingPartitions& partitions = *partitions_;
  ASSERT_THAT(partitions.broker().ResumeWrites(), IsOk());
  const std::string led_elsewhere = partitions.Enqueue({.queue = QueueIn(1)})->job_id;
  const std::string still_led = partitions.Enqueue({.queue = QueueIn(2)})->job_id;
  auto moved = std::make_shared<RecordingWatcher>();
  auto kept = std::make_shared<RecordingWatcher>();
  ASSERT_THAT(partitions.broker().broker(1).WatchJob(led_elsewhere, moved), IsOk());
  ASSERT_THAT(partitions.broker().broker(2).WatchJob(still_led, kept), IsOk());

  partitions.broker().HaltWrites(
      1, core::NotStorageFailure(absl::UnavailableError("partition 1 is led by node-b now")));
  ASSERT_TRUE(moved->ended().has_value()) << "the watch ends when the partition moves";
  EXPECT_THAT(*moved->ended(), StatusIs(Code::kUnavailable, HasSubstr("led by node-b")));
  EXPECT_FALSE(kept->ended().has_value()) << "partition 2 is still led here";
  EXPECT_THAT(
      partitions.broker().broker(1).WatchJob(led_elsewhere, std::make_shared<RecordingWatcher>()),
      StatusIs(Code::kUnavailable, HasSubstr("led by node-b")));

  // Led here again (rebuilt from its store): watched here again.
  ASSERT_THAT(partitions.broker().broker(1).ResumeWrites(), IsOk());
  auto again = std::make_shared<RecordingWatcher>();
  EXPECT_THAT(partitions.broker().broker(1).WatchJob(led_elsewhere, again), IsOk());
  EXPECT_FALSE(again->ended().has_value());
}

// The real store: each partition recovers its own jobs, and numbering goes on after a restart.
TEST(PartitionsRecoveryTest, EachPartitionRecoversItsJobsFromTheStoreAfterARestart) {
  storage::ScopedTempDir dir;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  core::BrokerOptions options;
  options.commit_mode = core::CommitPipeline::Mode::kBackground;
  std::vector<std::string> ids;
  uint64_t applied_before = 0;
  {
    auto store = storage::RocksDbStore::Open(dir.Sub("db"), {.partitions = kPartitions});
    ASSERT_THAT(store, IsOk());
    auto partitions = BlockingPartitions::Open(**store, clock, kPartitions, options);
    ASSERT_THAT(partitions, IsOk());
    for (uint32_t p = 0; p < kPartitions; ++p) {
      ids.push_back((*partitions)->Enqueue({.queue = QueueIn(p)})->job_id);
    }
    storage::RecordingVisitor seen;
    ASSERT_THAT((*store)->Recover(2, seen), IsOk());
    applied_before = seen.applied_seq;
    EXPECT_GT(applied_before, 0u);
  }
  auto store = storage::RocksDbStore::Open(dir.Sub("db"));
  ASSERT_THAT(store, IsOk());
  ASSERT_EQ((*store)->partitions(), kPartitions);
  auto partitions = BlockingPartitions::Open(**store, clock, kPartitions, options);
  ASSERT_THAT(partitions, IsOk());
  for (uint32_t p = 0; p < kPartitions; ++p) {
    EXPECT_EQ((*partitions)->GetJob(ids[p])->queue, QueueIn(p));
    EXPECT_EQ((*partitions)->broker().broker(p).ListQueues().size(), 1u);
  }
  ASSERT_THAT((*partitions)->Enqueue({.queue = QueueIn(2)}), IsOk());
  (*partitions)->Flush().IgnoreError();
  storage::RecordingVisitor seen;
  ASSERT_THAT((*store)->Recover(2, seen), IsOk());
  EXPECT_GT(seen.applied_seq, applied_before) << "a partition's numbering goes on";
}

}  // namespace
}  // namespace jobbroker::node
