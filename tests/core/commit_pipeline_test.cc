#include "core/commit_pipeline.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "storage/memory_store.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::core {

using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::StatusIs;

namespace {

// Holds its first Write until released, so a test can pile appends up behind it.
class GatedStore : public Store {
 public:
  absl::Status Write(absl::Span<const Transition> t) override {
    if (calls_.fetch_add(1) == 0) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    batch_sizes_.push_back(t.size());
    return inner_.Write(t);
  }
  absl::Status Recover(uint32_t partition, RecoveryVisitor& v) override {
    return inner_.Recover(partition, v);
  }
  absl::Status Resume() override { return inner_.Resume(); }
  absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner_.ReadJob(partition, id);
  }

  storage::MemoryStore inner_;
  std::atomic<int> calls_{0};
  absl::Notification entered_, release_;
  std::vector<size_t> batch_sizes_;  // only the writer thread touches it
};

Transition PutJob(const std::string& id, const std::string& payload) {
  Transition t;
  t.put_jobs.push_back(Job{.id = id, .queue = "q", .payload = payload});
  return t;
}

TEST(CommitPipelineTest, AppendsWaitingBehindAWriteShareTheNextOne) {
  GatedStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  uint64_t first = pipeline.Append(PutJob("a", "1"));
  store.entered_.WaitForNotification();
  std::atomic<int> durable{0};
  uint64_t last = 0;
  for (int i = 0; i < 10; ++i) {
    last = pipeline.Append(PutJob(absl::StrCat("b", i), "x"));
    pipeline.WhenDurable(last, [&](absl::Status s) {
      EXPECT_TRUE(s.ok());
      durable.fetch_add(1);
    });
  }
  EXPECT_EQ(durable.load(), 0) << "nothing is reported durable before it is written";
  store.release_.Notify();
  ASSERT_TRUE(pipeline.WaitDurable(last).ok());
  EXPECT_GT(last, first);
  EXPECT_EQ(durable.load(), 10);
  EXPECT_EQ(pipeline.writes(), 2u) << "ten appends behind one write take one more write";
  EXPECT_EQ(store.batch_sizes_.back(), 10u);
}

TEST(CommitPipelineTest, LaterTransitionsOfTheSameJobWin) {
  storage::MemoryStore store;
  {
    CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
    uint64_t seq = 0;
    for (int i = 0; i < 100; ++i) seq = pipeline.Append(PutJob("j", std::to_string(i)));
    ASSERT_TRUE(pipeline.WaitDurable(seq).ok());
  }
  EXPECT_EQ(store.FindJob("j")->payload, "99");
}

TEST(CommitPipelineTest, ConcurrentWritersAreAllMadeDurable) {
  storage::MemoryStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  std::mutex order_mu;  // Append's order is the caller's to keep; the broker holds its mutex
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        uint64_t seq;
        {
          std::lock_guard<std::mutex> lock(order_mu);
          seq = pipeline.Append(PutJob(absl::StrCat(t, "-", i), "p"));
        }
        ASSERT_TRUE(pipeline.WaitDurable(seq).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store.job_count(), 400u);
}

// Counts what the pipeline reports.
class CountingObserver : public BrokerObserver {
 public:
  void Committed(size_t transitions, absl::Duration) override { committed += transitions; }
  void StoreFailed(const absl::Status&) override { ++failures; }
  size_t committed = 0;
  int failures = 0;
};

TEST(CommitPipelineTest, AFailedWriteFailsItsWaitersAndStopsThePipeline) {
  testing::FaultyStore store;
  store.FailWritesAfter(1);
  FakeClock clock(absl::FromUnixSeconds(1000));
  CountingObserver observer;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kInline, &clock, &observer);
  EXPECT_TRUE(pipeline.WaitDurable(pipeline.Append(PutJob("a", ""))).ok());
  uint64_t failed = pipeline.Append(PutJob("b", ""));
  EXPECT_THAT(pipeline.WaitDurable(failed), StatusIs(absl::StatusCode::kUnavailable));
  store.FailWritesAfter(-1);
  uint64_t after = pipeline.Append(PutJob("c", ""));
  EXPECT_THAT(pipeline.WaitDurable(after), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(pipeline.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(store.FindJob("c").has_value()) << "nothing is written after a failure";
  EXPECT_EQ(observer.committed, 1u);
  EXPECT_EQ(observer.failures, 1) << "the failure is reported once";
}

// Reset() after a failure: what was appended meanwhile is dropped for good (also for a waiter
// that asks only afterwards), and later appends are written again.
TEST(CommitPipelineTest, ResetDropsWhatWasAppendedSinceTheFailureAndWritesAgain) {
  testing::FaultyStore store;
  std::vector<absl::Status> hooked;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground, nullptr, nullptr,
                          [&](const absl::Status& s) { hooked.push_back(s); });
  EXPECT_TRUE(pipeline.WaitDurable(pipeline.Append(PutJob("a", ""))).ok());
  store.FailWritesAfter(0);
  uint64_t failed = pipeline.Append(PutJob("b", ""));
  EXPECT_THAT(pipeline.WaitDurable(failed), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(pipeline.healthy());
  uint64_t meanwhile = pipeline.Append(PutJob("c", ""));
  store.FailWritesAfter(-1);
  pipeline.Reset();
  EXPECT_TRUE(pipeline.healthy());
  EXPECT_TRUE(pipeline.status().ok());
  EXPECT_THAT(pipeline.WaitDurable(meanwhile), StatusIs(absl::StatusCode::kUnavailable))
      << "dropped, even when asked after the reset";
  EXPECT_THAT(pipeline.WaitDurable(failed), StatusIs(absl::StatusCode::kUnavailable));
  uint64_t after = pipeline.Append(PutJob("d", ""));
  EXPECT_TRUE(pipeline.WaitDurable(after).ok());
  EXPECT_TRUE(store.FindJob("a").has_value());
  EXPECT_FALSE(store.FindJob("b").has_value());
  EXPECT_FALSE(store.FindJob("c").has_value()) << "appended while broken: never written";
  EXPECT_TRUE(store.FindJob("d").has_value());
  ASSERT_EQ(hooked.size(), 1u) << "the hook runs once per failure";
  EXPECT_THAT(hooked[0], StatusIs(absl::StatusCode::kUnavailable));
}

// Halt(): the owner stops the pipeline before any write fails (cluster mode, on losing a
// partition's leadership). What waits and what comes later gets the cause; the store is not
// written and the observer is not told of a store failure; Reset() writes again.
TEST(CommitPipelineTest, HaltFailsWhatIsNotDurableAndWritesNothingUntilReset) {
  GatedStore store;
  CountingObserver observer;
  std::vector<absl::Status> hooked;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground, nullptr, &observer,
                          [&](const absl::Status& s) { hooked.push_back(s); });
  pipeline.Append(PutJob("a", ""));
  store.entered_.WaitForNotification();  // the writer is inside Write with "a"
  const uint64_t pending = pipeline.Append(PutJob("b", ""));
  absl::Notification answered;
  absl::Status pending_status;
  pipeline.WhenDurable(pending, [&](absl::Status s) {
    pending_status = std::move(s);
    answered.Notify();
  });
  pipeline.Halt(absl::UnavailableError("partition 3: node-a stopped leading it"));
  ASSERT_TRUE(answered.HasBeenNotified()) << "a waiter is answered by Halt itself";
  EXPECT_THAT(pending_status,
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("node-a stopped")));
  EXPECT_FALSE(pipeline.healthy());
  EXPECT_THAT(pipeline.WaitDurable(pipeline.Append(PutJob("c", ""))),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("node-a stopped")));
  store.release_.Notify();  // the write in progress finishes; what was halted is not written
  // Halted already: only the cause changes (the partition's leader moved on).
  pipeline.Halt(absl::UnavailableError("partition 3 is led by node-b"));
  EXPECT_THAT(pipeline.status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("led by node-b")));
  EXPECT_THAT(pipeline.WaitDurable(pipeline.Append(PutJob("c2", ""))),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("led by node-b")));
  pipeline.Reset();
  EXPECT_TRUE(pipeline.WaitDurable(pipeline.Append(PutJob("d", ""))).ok());
  EXPECT_TRUE(store.inner_.FindJob("a").has_value());
  EXPECT_FALSE(store.inner_.FindJob("b").has_value());
  EXPECT_FALSE(store.inner_.FindJob("c").has_value());
  EXPECT_TRUE(store.inner_.FindJob("d").has_value());
  EXPECT_EQ(observer.failures, 0) << "a halt is not a store failure";
  ASSERT_EQ(hooked.size(), 1u) << "the hook runs once, so the owner's ticker wakes";
}

// Records which kind of write each call was, and can hold writes until released.
class LevelStore : public Store {
 public:
  absl::Status Write(absl::Span<const Transition> t) override { return Record("sync", t); }
  absl::Status WriteUnsynced(absl::Span<const Transition> t) override {
    return Record("unsynced", t);
  }
  absl::Status Sync() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &syncs_held_));
    calls_.push_back("fsync");
    return absl::OkStatus();
  }
  absl::Status Recover(uint32_t partition, RecoveryVisitor& v) override {
    return inner_.Recover(partition, v);
  }
  absl::Status Resume() override { return inner_.Resume(); }
  absl::StatusOr<Job> ReadJob(uint32_t partition, const std::string& id) override {
    return inner_.ReadJob(partition, id);
  }

  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  // Waits until a write is held (the writer took its batch).
  void AwaitHeldWrite() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n > 0; }, &waiting_));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  // Sync() waits while held (writes do not).
  void HoldSyncs(bool held) {
    absl::MutexLock lock(&mu_);
    syncs_held_ = held;
  }
  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  storage::MemoryStore inner_;

 private:
  absl::Status Record(const char* kind, absl::Span<const Transition> t) {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
    --waiting_;
    calls_.push_back(kind);
    return inner_.Write(t);
  }

  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool syncs_held_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(CommitPipelineDurabilityTest, GroupIsAnsweredOnceWrittenAndFsyncedWithinItsDelay) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  uint64_t seq = pipeline.Append(PutJob("a", "1"), Durability::kGroup, absl::Milliseconds(5));
  ASSERT_TRUE(pipeline.WaitDurable(seq, Durability::kGroup).ok());
  EXPECT_TRUE(store.inner_.FindJob("a").has_value()) << "answered only once written";
  // Nothing else is appended: the writer fsyncs on its own when the delay is up, which a kSync
  // waiter of the same transition sees.
  absl::Notification durable;
  pipeline.WhenDurable(
      seq,
      [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        durable.Notify();
      },
      Durability::kSync);
  ASSERT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the group delay passed without an fsync";
  // Written unsynced, then fsynced when the delay was up; or, on a machine so busy that the
  // writer took the transition only after its delay had passed, written synced at once.
  const std::vector<std::string> calls = store.calls();
  EXPECT_TRUE(calls == (std::vector<std::string>{"unsynced", "fsync"}) ||
              calls == (std::vector<std::string>{"sync"}))
      << absl::StrJoin(calls, ", ");
  EXPECT_EQ(pipeline.syncs(), 1u);
}

TEST(CommitPipelineDurabilityTest, EarlyWrittenReleasesLogWaitersBeforeTheFsync) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  store.HoldSyncs(true);
  const uint64_t seq = pipeline.Append(PutJob("a", ""), Durability::kSync, absl::ZeroDuration(),
                                       /*early_written=*/true);
  absl::Notification written;
  absl::Notification durable;
  std::vector<std::string> calls_when_written;
  pipeline.WhenDurable(
      seq,
      [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        calls_when_written = store.calls();
        written.Notify();
      },
      Durability::kGroup);
  pipeline.WhenDurable(seq, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    durable.Notify();
  });
  // The fsync is held: only the log waiter can be answered.
  ASSERT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(calls_when_written, std::vector<std::string>{"unsynced"});
  EXPECT_TRUE(store.inner_.FindJob("a").has_value());
  EXPECT_FALSE(durable.HasBeenNotified()) << "answered before its fsync";
  store.HoldSyncs(false);
  ASSERT_TRUE(durable.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(store.calls(), (std::vector<std::string>{"unsynced", "fsync"}));
  EXPECT_EQ(pipeline.writes(), 1u);
  EXPECT_EQ(pipeline.syncs(), 1u);
}

TEST(CommitPipelineDurabilityTest, WithoutEarlyWrittenASyncTransitionIsOneSyncedWrite) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  const uint64_t seq = pipeline.Append(PutJob("a", ""), Durability::kSync);
  ASSERT_TRUE(pipeline.WaitDurable(seq, Durability::kGroup).ok());
  ASSERT_TRUE(pipeline.WaitDurable(seq).ok());
  EXPECT_EQ(store.calls(), std::vector<std::string>{"sync"});
}

TEST(CommitPipelineDurabilityTest, ASyncTransitionInTheBatchMakesTheWholeWriteSynced) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  store.Hold();
  uint64_t first = pipeline.Append(PutJob("first", ""), Durability::kSync);
  store.AwaitHeldWrite();
  // The writer holds `first`; these two wait behind it and share the next write.
  uint64_t group = pipeline.Append(PutJob("g", ""), Durability::kGroup, absl::Seconds(1));
  uint64_t sync = pipeline.Append(PutJob("s", ""), Durability::kSync);
  store.Release();
  ASSERT_TRUE(pipeline.WaitDurable(sync).ok());
  EXPECT_TRUE(pipeline.WaitDurable(group, Durability::kSync).ok());
  EXPECT_GT(sync, first);
  for (const std::string& call : store.calls()) EXPECT_EQ(call, "sync");
}

TEST(CommitPipelineDurabilityTest, NoneIsAnsweredBeforeItIsWrittenAndWrittenRightAfter) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  store.Hold();
  pipeline.Append(PutJob("blocker", ""), Durability::kSync);
  store.AwaitHeldWrite();
  uint64_t none = pipeline.Append(PutJob("n", ""), Durability::kNone);
  absl::Notification answered;
  pipeline.WhenDurable(
      none,
      [&](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        answered.Notify();
      },
      Durability::kNone);
  EXPECT_TRUE(answered.HasBeenNotified()) << "kNone does not wait for the writer";
  EXPECT_FALSE(store.inner_.FindJob("n").has_value());
  store.Release();
  ASSERT_TRUE(pipeline.WaitDurable(none, Durability::kGroup).ok());
  EXPECT_TRUE(store.inner_.FindJob("n").has_value());
  EXPECT_EQ(store.calls().back(), "unsynced") << "a kNone batch is written without fsync";
}

// WhenDurable at kSync, waited for with a bound only against hanging for ever (a minute).
class OnDisk {
 public:
  OnDisk(CommitPipeline& pipeline, uint64_t seq) {
    pipeline.WhenDurable(seq, [state = state_](absl::Status s) {
      state->status = std::move(s);
      state->done.Notify();
    });
  }
  // True once `seq` is on disk with OK; false on an error or after the minute.
  bool Arrived() {
    return state_->done.WaitForNotificationWithTimeout(absl::Seconds(60)) && state_->status.ok();
  }

 private:
  struct State {
    absl::Notification done;
    absl::Status status;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Waiting for the fsync of something nothing asked to fsync (a kNone write; the broker's Flush at
// shutdown) asks for one: it used to wait for a sync that never came, so a broker whose queues
// were all NONE hung on SIGTERM until it was killed.
TEST(CommitPipelineDurabilityTest, WaitingForDiskFsyncsAnUnsyncedWrite) {
  LevelStore store;
  CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
  uint64_t written = pipeline.Append(PutJob("written", ""), Durability::kNone);
  ASSERT_TRUE(pipeline.WaitDurable(written, Durability::kGroup).ok());
  ASSERT_TRUE(OnDisk(pipeline, written).Arrived());
  EXPECT_EQ(store.calls(), (std::vector<std::string>{"unsynced", "fsync"}));

  // The same for one still waiting to be written: its write is synced.
  store.Hold();
  pipeline.Append(PutJob("blocker", ""), Durability::kNone);
  store.AwaitHeldWrite();
  uint64_t pending = pipeline.Append(PutJob("pending", ""), Durability::kNone);
  OnDisk pending_on_disk(pipeline, pending);
  store.Release();
  ASSERT_TRUE(pending_on_disk.Arrived());
  std::vector<std::string> calls = store.calls();
  ASSERT_GE(calls.size(), 4u);
  EXPECT_TRUE(calls.back() == "sync" || calls.back() == "fsync") << calls.back();

  // And for one the writer is writing unsynced at that very moment: an fsync follows the write.
  store.Hold();
  uint64_t writing = pipeline.Append(PutJob("writing", ""), Durability::kNone);
  store.AwaitHeldWrite();
  OnDisk writing_on_disk(pipeline, writing);
  store.Release();
  ASSERT_TRUE(writing_on_disk.Arrived());
  calls = store.calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[calls.size() - 2], "unsynced");
  EXPECT_EQ(calls.back(), "fsync");
}

TEST(CommitPipelineDurabilityTest, StoppingFsyncsWhatWasWrittenUnsynced) {
  LevelStore store;
  {
    CommitPipeline pipeline(store, CommitPipeline::Mode::kBackground);
    uint64_t seq = pipeline.Append(PutJob("n", ""), Durability::kNone);
    ASSERT_TRUE(pipeline.WaitDurable(seq, Durability::kGroup).ok());
  }
  EXPECT_EQ(store.calls(), (std::vector<std::string>{"unsynced", "fsync"}));
}

}  // namespace
}  // namespace jobbroker::core
