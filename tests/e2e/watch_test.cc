// Admin.WatchJob against the real binary: the messages a watcher gets, the end of the call, a
// thousand idle watchers (their CPU cost is printed, from /proc), and the C++ client's
// EnqueueAndWait across a kill -9.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"

namespace jobbroker::testing {
namespace {

using ::testing::ElementsAre;

// CPU time (user + system) the process `pid` has used, from /proc/<pid>/stat.
absl::Duration CpuTimeOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  // Fields after the command name (which may hold spaces), from field 3 on.
  std::vector<std::string> fields = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
  const long ticks_per_second = sysconf(_SC_CLK_TCK);
  const int64_t ticks = std::stoll(fields[11]) + std::stoll(fields[12]);  // utime, stime
  return absl::Seconds(static_cast<double>(ticks) / static_cast<double>(ticks_per_second));
}

// A channel with a connection of its own (channels with the same arguments share one).
std::shared_ptr<grpc::Channel> OwnConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// One WatchJob call, read on gRPC's threads.
class Watch final : public grpc::ClientReadReactor<v1::Job> {
 public:
  Watch(v1::Admin::Stub& stub, const std::string& job_id) {
    request_.set_job_id(job_id);
    stub.async()->WatchJob(&ctx_, &request_, this);
    StartRead(&job_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      states_.push_back(job_.state());
    }
    StartRead(&job_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  bool AwaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  std::vector<v1::JobState> states() {
    absl::MutexLock lock(&mu_);
    return states_;
  }
  size_t seen() {
    absl::MutexLock lock(&mu_);
    return states_.size();
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // A call still open when a test ends (a failed assertion) is cancelled and waited for: gRPC
  // must be done with the reactor before it goes.
  ~Watch() override {
    ctx_.TryCancel();
    AwaitDone(absl::InfiniteDuration());
  }
  void Cancel() { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  v1::WatchJobRequest request_;
  v1::Job job_;
  absl::Mutex mu_;
  std::vector<v1::JobState> states_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

class WatchTest : public BrokerFixture {};

TEST_F(WatchTest, AWatcherGetsTheJobThenEachChangeAndTheCallEndsAfterItsEnd) {
  const std::string id = client().MustEnqueue("reports");
  Watch watch(admin(), id);
  ASSERT_TRUE(WaitFor([&] { return watch.seen() == 1; }));
  std::optional<v1::LeasedJob> leased = client().LeaseOne("reports", "w");
  ASSERT_TRUE(leased.has_value());
  v1::HeartbeatRequest beat;
  beat.set_job_id(id);
  beat.set_lease_id(leased->lease_id());
  beat.set_progress(R"({"percent": 30})");
  v1::HeartbeatResponse beat_reply;
  ASSERT_TRUE(client().Heartbeat(beat, &beat_reply).ok());
  client().MustAck(*leased, "report.pdf");
  ASSERT_TRUE(watch.AwaitDone(absl::Seconds(30)));
  EXPECT_TRUE(watch.status().ok()) << watch.status().error_message();
  EXPECT_THAT(watch.states(), ElementsAre(v1::JOB_STATE_READY, v1::JOB_STATE_ACTIVE,
                                          v1::JOB_STATE_ACTIVE, v1::JOB_STATE_COMPLETED));
}

TEST_F(WatchTest, AnUnknownJobIsNotFound) {
  Watch watch(admin(), "01ARZ3NDEKTSV4RRFFQ69G5FAV");
  ASSERT_TRUE(watch.AwaitDone(absl::Seconds(30)));
  EXPECT_EQ(watch.status().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(WatchTest, AThousandIdleWatchersOverFourConnectionsEachSeeTheirJobEnd) {
  constexpr int kWatchers = 1000;
  std::vector<std::string> ids;
  for (int i = 0; i < kWatchers; ++i) ids.push_back(client().MustEnqueue("many", "p"));
  // Over four connections, as four producers would: the broker takes at most 1,000 calls at a
  // time on one connection, and the leases and acks below need their own.
  std::vector<std::unique_ptr<v1::Admin::Stub>> stubs;
  for (int i = 0; i < 4; ++i)
    stubs.push_back(v1::Admin::NewStub(OwnConnection(process().address())));
  std::vector<std::unique_ptr<Watch>> watches;
  for (size_t i = 0; i < ids.size(); ++i)
    watches.push_back(std::make_unique<Watch>(*stubs[i % stubs.size()], ids[i]));
  ASSERT_TRUE(WaitFor([&] {
    for (auto& w : watches)
      if (w->seen() == 0) return false;
    return true;
  })) << "every watcher gets its job first";

  // What the broker spends while a thousand watches are open and nothing changes. Printed, not
  // asserted against a bound (this machine is shared): docs/workflows.md quotes the figure.
  const absl::Duration before = CpuTimeOf(process().pid());
  absl::SleepFor(absl::Seconds(5));
  const absl::Duration idle = CpuTimeOf(process().pid()) - before;
  std::cout << "[ measured ] " << kWatchers << " idle watchers: broker CPU "
            << absl::ToDoubleMilliseconds(idle) << " ms over 5 s\n";

  for (int done = 0; done < kWatchers;) {
    std::vector<v1::LeasedJob> jobs = client().MustLease("many", "w", 500);
    ASSERT_FALSE(jobs.empty());
    for (const v1::LeasedJob& job : jobs) client().MustAck(job);
    done += static_cast<int>(jobs.size());
  }
  for (auto& w : watches) {
    ASSERT_TRUE(w->AwaitDone(absl::Seconds(60)));
    EXPECT_TRUE(w->status().ok()) << w->status().error_message();
    ASSERT_FALSE(w->states().empty());
    EXPECT_EQ(w->states().back(), v1::JOB_STATE_COMPLETED);
  }
}

TEST_F(WatchTest, EnqueueAndWaitReturnsTheWorkersResult) {
  client::Client producer({.address = process().address()});
  std::atomic<bool> returned{false};
  absl::StatusOr<v1::Job> outcome;
  std::thread waiter([&] {
    outcome = producer.EnqueueAndWait("waited", "p", {}, absl::Seconds(60));
    returned = true;
  });
  std::optional<v1::LeasedJob> leased = client().LeaseOne("waited", "w", absl::Seconds(30));
  ASSERT_TRUE(leased.has_value());
  EXPECT_FALSE(returned.load()) << "returned before the job ended";
  client().MustAck(*leased, "42");
  waiter.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(outcome->result(), "42");
}

TEST_F(WatchTest, AWatchCutByAKill9EndsUnavailableAndTheNextOneSeesTheJobAsAcknowledged) {
  const std::string id = client().MustEnqueue("cut");
  std::optional<v1::LeasedJob> leased =
      client().LeaseOne("cut", "w", absl::ZeroDuration(), absl::Hours(1));
  ASSERT_TRUE(leased.has_value());
  auto watch = std::make_unique<Watch>(admin(), id);
  ASSERT_TRUE(WaitFor([&] { return watch->seen() == 1; }));
  Kill9AndRestart();
  ASSERT_TRUE(watch->AwaitDone(absl::Seconds(30)));
  EXPECT_EQ(watch->status().error_code(), grpc::StatusCode::UNAVAILABLE);
  Watch again(admin(), id);
  ASSERT_TRUE(WaitFor([&] { return again.seen() == 1; }));
  EXPECT_THAT(again.states(), ElementsAre(v1::JOB_STATE_ACTIVE)) << "the lease survived the kill";
  client().MustAck(*leased, "");
  ASSERT_TRUE(again.AwaitDone(absl::Seconds(30)));
  EXPECT_TRUE(again.status().ok());
  EXPECT_EQ(again.states().back(), v1::JOB_STATE_COMPLETED);
}

}  // namespace
}  // namespace jobbroker::testing
