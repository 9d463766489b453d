// Metric updates per transition: a real broker (fake clock, memory store) drives the
// MetricsObserver, and the registry's samples are read back.
#include "server/observability/metrics_observer.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/broker.h"
#include "core/clock.h"
#include "core/ids.h"
#include "core/observer.h"
#include "gtest/gtest.h"
#include "node/partitions.h"
#include "prometheus/registry.h"
#include "server/observability/metrics.h"
#include "storage/memory_store.h"
#include "tests/testing/blocking_broker.h"
#include "tests/testing/fake_clock.h"

namespace jobbroker::server {

using BlockingPartitions = ::jobbroker::testing::BlockingEngine<node::Partitions>;

using ::jobbroker::testing::FakeClock;
using ::jobbroker::testing::TickingClock;

namespace {

// name{label=value,...} -> value, for counters and gauges, and histogram _count samples.
std::map<std::string, double> Samples(prometheus::Registry& registry) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      if (f.type == prometheus::MetricType::Histogram) key += "_count";
      std::string labels;
      for (const prometheus::ClientMetric::Label& l : m.label)
        labels += (labels.empty() ? "" : ",") + l.name + "=" + l.value;
      if (!labels.empty()) key += "{" + labels + "}";
      out[key] = f.type == prometheus::MetricType::Histogram
                     ? static_cast<double>(m.histogram.sample_count)
                 : f.type == prometheus::MetricType::Gauge ? m.gauge.value
                                                           : m.counter.value;
    }
  }
  return out;
}

class MetricsObserverTest : public ::testing::Test {
 protected:
  explicit MetricsObserverTest(size_t max_queues = 1000)
      : clock_(absl::FromUnixSeconds(1'800'000'000)),
        labels_(max_queues),
        metrics_(registry_, labels_) {
    Open();
  }

  // Several partitions over store_: what the collector scrapes is the sum over them.
  void Open() {
    core::BrokerOptions o;
    o.commit_mode = core::CommitPipeline::Mode::kInline;
    o.observer = &metrics_;
    o.uniform = [] { return 0.5; };
    broker_ = *BlockingPartitions::Open(store_, clock_, 3u, o);
  }

  core::LeasedJob LeaseOne(const std::string& queue, absl::Duration lease = absl::Seconds(30)) {
    return broker_->Lease(core::LeaseSpec{queue, "w", 1, lease})->front();
  }

  FakeClock clock_;
  storage::MemoryStore store_;
  prometheus::Registry registry_;
  QueueLabels labels_;
  MetricsObserver metrics_;
  std::unique_ptr<BlockingPartitions> broker_;
};

TEST_F(MetricsObserverTest, EachTransitionCountsOnce) {
  core::EnqueueSpec dedup{.queue = "q", .payload = "p"};
  dedup.dedup_key = "k";
  ASSERT_TRUE(broker_->Enqueue(dedup).ok());
  ASSERT_TRUE(broker_->Enqueue(dedup).ok());  // deduplicated
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}).ok());

  clock_.Advance(absl::Seconds(2));
  core::LeasedJob acked = LeaseOne("q");
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(broker_->Ack(core::AckSpec{acked.job_id, acked.lease_id, ""}).ok());
  core::LeasedJob retried = LeaseOne("q");
  ASSERT_TRUE(broker_->Fail(core::FailSpec{retried.job_id, retried.lease_id, "x", false, {}}).ok());
  core::LeasedJob dead = LeaseOne("q");
  ASSERT_TRUE(broker_->Fail(core::FailSpec{dead.job_id, dead.lease_id, "bad", true, {}}).ok());
  core::LeasedJob released = LeaseOne("q");
  ASSERT_TRUE(broker_->Release(core::ReleaseSpec{released.job_id, released.lease_id}).ok());
  core::LeasedJob expired = LeaseOne("q", absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  broker_->Tick();
  std::string waiting =
      broker_->Enqueue(core::EnqueueSpec{.queue = "q", .delay = absl::Hours(1)})->job_id;
  ASSERT_TRUE(broker_->CancelJob(waiting).ok());

  std::map<std::string, double> s = Samples(registry_);
  EXPECT_EQ(s["jobbroker_enqueued_total{queue=q}"], 6);
  EXPECT_EQ(s["jobbroker_deduplicated_total{queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_leased_total{queue=q}"], 5);
  EXPECT_EQ(s["jobbroker_attempts_total{outcome=completed,queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_attempts_total{outcome=error,queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_attempts_total{outcome=permanent_error,queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_attempts_total{outcome=lease_expired,queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_retried_total{queue=q}"], 2) << "the error and the lease expiry";
  EXPECT_EQ(s["jobbroker_dead_total{queue=q,reason=permanent}"], 1);
  EXPECT_EQ(s["jobbroker_dead_total{queue=q,reason=attempts_exhausted}"], 0);
  EXPECT_EQ(s["jobbroker_released_total{queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_cancelled_total{queue=q}"], 1);
  EXPECT_EQ(s["jobbroker_schedule_to_start_seconds_count{queue=q}"], 5);
  EXPECT_EQ(s["jobbroker_run_seconds_count{queue=q}"], 4);
  EXPECT_GT(s["jobbroker_wal_sync_seconds_count"], 0) << "every commit is timed";
}

TEST_F(MetricsObserverTest, HistogramsMeasureOnTheBrokersClock) {
  ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}).ok());
  clock_.Advance(absl::Seconds(7));  // waited 7 s in READY
  core::LeasedJob j = LeaseOne("q");
  clock_.Advance(absl::Seconds(2));  // ran 2 s
  ASSERT_TRUE(broker_->Ack(core::AckSpec{j.job_id, j.lease_id, ""}).ok());
  int seen = 0;
  for (const prometheus::MetricFamily& f : registry_.Collect()) {
    if (f.name == "jobbroker_schedule_to_start_seconds") {
      EXPECT_DOUBLE_EQ(f.metric.at(0).histogram.sample_sum, 7);
      ++seen;
    }
    if (f.name == "jobbroker_run_seconds") {
      EXPECT_DOUBLE_EQ(f.metric.at(0).histogram.sample_sum, 2);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
}

TEST_F(MetricsObserverTest, EveryPartitionsRecoveryIsCountedWithItsJobsAndExpiredLeases) {
  // The fixture opened 3 partitions over an empty store: three recoveries of nothing.
  std::map<std::string, double> s = Samples(registry_);
  EXPECT_EQ(s["jobbroker_recovery_seconds_count"], 3);
  EXPECT_EQ(s["jobbroker_recovered_jobs_total"], 0);

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}).ok());
  LeaseOne("q", absl::Seconds(1));
  broker_.reset();                   // the process stops while a worker holds a lease...
  clock_.Advance(absl::Seconds(5));  // ...and is down longer than the lease

  Open();
  s = Samples(registry_);
  EXPECT_EQ(s["jobbroker_recovery_seconds_count"], 6);
  EXPECT_EQ(s["jobbroker_recovered_jobs_total"], 3);
  EXPECT_EQ(s["jobbroker_recovery_expired_leases_total"], 1);
  for (const prometheus::MetricFamily& f : registry_.Collect()) {
    if (f.name == "jobbroker_recovery_seconds") {
      EXPECT_DOUBLE_EQ(f.metric.at(0).histogram.sample_sum, 0)
          << "timed on the broker's clock, which did not move while it recovered";
    }
  }
}

TEST_F(MetricsObserverTest, EachPartitionShowsItsLastRecoveryDoneWithWhatItLoaded) {
  // The fixture's three recoveries of an empty store.
  std::map<std::string, double> s = Samples(registry_);
  for (const char* p : {"0", "1", "2"}) {
    const std::string label = std::string("{partition=") + p + "}";
    EXPECT_EQ(s.at("jobbroker_recovering" + label), 0) << p;
    EXPECT_EQ(s.at("jobbroker_recovery_loaded_jobs" + label), 0) << p;
  }

  for (int i = 0; i < 4; ++i) ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = "q"}).ok());
  broker_.reset();
  Open();
  s = Samples(registry_);
  const std::string own = "{partition=" + absl::StrCat(core::PartitionOfQueue("q", 3)) + "}";
  double loaded = 0;
  for (const char* p : {"0", "1", "2"}) {
    const std::string label = std::string("{partition=") + p + "}";
    EXPECT_EQ(s.at("jobbroker_recovering" + label), 0) << p;
    loaded += s.at("jobbroker_recovery_loaded_jobs" + label);
  }
  EXPECT_EQ(s.at("jobbroker_recovery_loaded_jobs" + own), 4) << "the queue's partition";
  EXPECT_EQ(loaded, 4) << "and none elsewhere";
}

// Reads the recovery gauges of partition 0 each time the recovery reports progress: what a
// scrape in the middle of a long restart sees.
class RecoveryProbe final : public core::BrokerObserver {
 public:
  explicit RecoveryProbe(prometheus::Registry& registry) : registry_(registry) {}
  void Recovering(uint32_t /*partition*/, size_t jobs, absl::Duration /*elapsed*/) override {
    std::map<std::string, double> s = Samples(registry_);
    seen.push_back({static_cast<double>(jobs), s.at("jobbroker_recovering{partition=0}"),
                    s.at("jobbroker_recovery_loaded_jobs{partition=0}")});
  }
  struct Seen {
    double reported_jobs, recovering, loaded_jobs;
  };
  std::vector<Seen> seen;

 private:
  prometheus::Registry& registry_;
};

TEST(RecoveryMetricsTest, AFailedRecoveryIsNoLongerUnderWay) {
  prometheus::Registry registry;
  QueueLabels labels(10);
  MetricsObserver metrics(registry, labels);
  metrics.RecoveryStarted(4);
  metrics.Recovering(4, 1000, absl::Seconds(5));
  EXPECT_EQ(Samples(registry).at("jobbroker_recovering{partition=4}"), 1);
  metrics.RecoveryFailed(4, absl::DataLossError("unreadable"));
  std::map<std::string, double> s = Samples(registry);
  EXPECT_EQ(s.at("jobbroker_recovering{partition=4}"), 0);
  EXPECT_EQ(s.at("jobbroker_recovery_loaded_jobs{partition=4}"), 1000) << "as far as it got";
  EXPECT_EQ(s.at("jobbroker_recovery_seconds_count"), 0) << "only finished ones are timed";
}

TEST(RecoveryMetricsTest, AScrapeDuringARecoveryShowsItUnderWayAndHowFarItGot) {
  storage::MemoryStore store;
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  core::BrokerOptions o;
  o.commit_mode = core::CommitPipeline::Mode::kInline;
  {
    auto broker = BlockingPartitions::Open(store, clock, 1u, o);
    ASSERT_TRUE(broker.ok()) << broker.status();
    for (int i = 0; i < 100; ++i)
      ASSERT_TRUE((*broker)->Enqueue(core::EnqueueSpec{.queue = "q"}).ok());
  }

  prometheus::Registry registry;
  QueueLabels labels(10);
  MetricsObserver metrics(registry, labels);
  RecoveryProbe probe(registry);
  core::TeeObserver both({&metrics, &probe});  // the probe reads what the metrics just got
  TickingClock ticking(absl::FromUnixSeconds(1'800'000'000));  // 2 s per read of the clock
  o.observer = &both;
  o.recovery_chunk_jobs = 10;
  auto broker = BlockingPartitions::Open(store, ticking, 1u, o);
  ASSERT_TRUE(broker.ok()) << broker.status();

  ASSERT_GE(probe.seen.size(), 2u) << "10 chunks, the clock 2 s later at each read";
  for (const RecoveryProbe::Seen& seen : probe.seen) {
    EXPECT_EQ(seen.recovering, 1);
    EXPECT_EQ(seen.loaded_jobs, seen.reported_jobs);
    EXPECT_LE(seen.loaded_jobs, 100);
  }
  std::map<std::string, double> s = Samples(registry);
  EXPECT_EQ(s.at("jobbroker_recovering{partition=0}"), 0);
  EXPECT_EQ(s.at("jobbroker_recovery_loaded_jobs{partition=0}"), 100);
}

TEST(QueueLabelsTest, TheFirstQueuesKeepTheirNameAndTheRestShareOne) {
  QueueLabels labels(2);
  EXPECT_EQ(labels.For("a"), "a");
  EXPECT_EQ(labels.For("b"), "b");
  EXPECT_EQ(labels.For("c"), QueueLabels::kOtherQueues);
  EXPECT_EQ(labels.For("a"), "a") << "a label never changes";
  EXPECT_EQ(labels.For("c"), QueueLabels::kOtherQueues);
  EXPECT_EQ(std::string(QueueLabels::kOtherQueues), "(other)");

  QueueLabels unlimited(0);
  for (int i = 0; i < 5000; ++i) {
    const std::string q = "q" + std::to_string(i);
    ASSERT_EQ(unlimited.For(q), q);
  }
}

// Two queues labelled, two more counted together: a broker with thousands of queues keeps its
// /metrics page bounded, and nothing is lost from the totals.
class CappedMetricsTest : public MetricsObserverTest {
 protected:
  CappedMetricsTest() : MetricsObserverTest(/*max_queues=*/2) {}
};

TEST_F(CappedMetricsTest, QueuesPastTheLimitAreCountedUnderOther) {
  for (const char* q : {"a", "b", "c", "d", "d"})
    ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = q}).ok());
  core::LeasedJob j = LeaseOne("d");
  ASSERT_TRUE(broker_->Ack(core::AckSpec{j.job_id, j.lease_id, ""}).ok());

  std::map<std::string, double> s = Samples(registry_);
  EXPECT_EQ(s["jobbroker_enqueued_total{queue=a}"], 1);
  EXPECT_EQ(s["jobbroker_enqueued_total{queue=b}"], 1);
  EXPECT_EQ(s["jobbroker_enqueued_total{queue=(other)}"], 3);
  EXPECT_EQ(s["jobbroker_attempts_total{outcome=completed,queue=(other)}"], 1);
  EXPECT_EQ(s.count("jobbroker_enqueued_total{queue=c}"), 0u);
  EXPECT_EQ(s.count("jobbroker_enqueued_total{queue=d}"), 0u);
}

TEST_F(CappedMetricsTest, TheScrapeGaugesSumTheOtherQueues) {
  for (const char* q : {"a", "b", "c", "d", "d"})
    ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = q}).ok());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(broker_->Enqueue(core::EnqueueSpec{.queue = "d"}).ok());

  // queue label -> state -> jobs, and queue label -> oldest ready age.
  std::map<std::string, std::map<std::string, double>> jobs;
  std::map<std::string, double> age;
  BrokerCollector collector(broker_->broker(), labels_);
  for (const prometheus::MetricFamily& f : collector.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string queue, state;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "queue") queue = l.value;
        if (l.name == "state") state = l.value;
      }
      if (f.name == "jobbroker_jobs") jobs[queue][state] = m.gauge.value;
      if (f.name == "jobbroker_oldest_ready_age_seconds") age[queue] = m.gauge.value;
    }
  }
  EXPECT_EQ(jobs.size(), 3u) << "a, b and (other)";
  EXPECT_EQ(jobs["a"]["ready"], 1);
  EXPECT_EQ(jobs["b"]["ready"], 1);
  EXPECT_EQ(jobs["(other)"]["ready"], 4) << "c's one and d's three";
  EXPECT_EQ(age["(other)"], 5) << "the oldest of them";
}

}  // namespace
}  // namespace jobbroker::server
