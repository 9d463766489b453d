// A node started before its etcd, between real processes: compose files, Kubernetes rollouts and
// test harnesses start etcd and the nodes together, and etcd may take seconds to answer. The node
// waits for it (--cluster-etcd-wait, logged as waiting_for_etcd) and serves once it answers;
// it gives up after the wait, and a SIGTERM while it waits ends it.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/etcd_process.h"

namespace jobbroker::testing {
namespace {

using ::testing::HasSubstr;

// A hang fails, a slow machine does not: never asserted as a duration.
constexpr absl::Duration kGiveUp = absl::Seconds(60);
constexpr char kServing[] = "jobbroker: serving grpc=";

class EtcdStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    auto etcd = EtcdProcess::Start(dir_->path() + "/etcd");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    etcd_->Kill9();  // its URL is known; it answers nothing until Restart()
  }

  // A one-node cluster (RF 1) on etcd_, as a child whose output is in node.log.
  absl::StatusOr<std::unique_ptr<ChildProcess>> StartNode(std::vector<std::string> extra_args) {
    std::vector<std::string> argv = {BrokerBinaryPath(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     dir_->path() + "/node",
                                     "--cluster-etcd",
                                     etcd_->client_url(),
                                     "--node-id",
                                     "node-0",
                                     "--partitions",
                                     "2",
                                     "--replication-factor",
                                     "1",
                                     "--min-in-sync",
                                     "1"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    return ChildProcess::Start(std::move(argv), dir_->path() + "/node.log");
  }

  // Until the node's output holds `needle` (true), or it exited or kGiveUp passed (false).
  static bool AwaitOutput(ChildProcess& node, absl::string_view needle) {
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      if (absl::StrContains(node.ReadLog(), needle)) return true;
      if (!node.Running()) return absl::StrContains(node.ReadLog(), needle);
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<EtcdProcess> etcd_;
};

TEST_F(EtcdStartTest, ANodeStartedBeforeItsEtcdWaitsForItAndThenServes) {
  auto node = StartNode({});
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE(AwaitOutput(**node, "\"event\":\"waiting_for_etcd\"")) << (*node)->ReadLog();
  EXPECT_THAT((*node)->ReadLog(), HasSubstr(etcd_->client_url()));

  ASSERT_TRUE(etcd_->Restart().ok());
  ASSERT_TRUE(AwaitOutput(**node, kServing)) << (*node)->ReadLog();
  const std::string log = (*node)->ReadLog();
  const size_t at = log.find(kServing) + sizeof(kServing) - 1;
  const std::string address = log.substr(at, log.find(' ', at) - at);

  // It leads both partitions and takes a job in each.
  auto broker = v1::Broker::NewStub(NewChannel(address));
  for (const std::string queue : {"a", "b", "c", "d"}) {
    grpc::Status status;
    const absl::Time give_up = absl::Now() + kGiveUp;
    do {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      v1::EnqueueRequest request;
      request.set_queue(queue);
      v1::EnqueueResponse response;
      status = broker->Enqueue(&context, request, &response);
      if (!status.ok()) absl::SleepFor(absl::Milliseconds(100));
    } while (!status.ok() && absl::Now() < give_up);
    EXPECT_TRUE(status.ok()) << queue << ": " << status.error_message();
  }
  EXPECT_TRUE((*node)->Running());
}

TEST_F(EtcdStartTest, ANodeGivesUpOnAnEtcdThatDoesNotAnswerWithinItsWait) {
  auto node = StartNode({"--cluster-etcd-wait", "2"});
  ASSERT_TRUE(node.ok()) << node.status();
  const absl::Time give_up = absl::Now() + kGiveUp;
  while ((*node)->Running() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_FALSE((*node)->Running()) << (*node)->ReadLog();
  EXPECT_EQ((*node)->exit_code(), 1);
  const std::string log = (*node)->ReadLog();
  EXPECT_THAT(log, HasSubstr("\"event\":\"waiting_for_etcd\""));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("jobbroker: --cluster-etcd: etcd did not answer within "
                                          "2s: etcd ",
                                          etcd_->client_url())));
  EXPECT_THAT(log, HasSubstr("(--cluster-etcd-wait 2)"));
}

TEST_F(EtcdStartTest, ANodeWaitingForEtcdStopsOnSigterm) {
  auto node = StartNode({"--cluster-etcd-wait", "3600"});
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE(AwaitOutput(**node, "\"event\":\"waiting_for_etcd\"")) << (*node)->ReadLog();
  // Stop() sends SIGTERM and kills after the grace: ended by SIGTERM itself, not by the SIGKILL
  // that follows the grace, says the node stopped instead of waiting out its hour.
  absl::StatusOr<int> code = (*node)->Stop(kGiveUp);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGTERM) << (*node)->ReadLog();
  EXPECT_THAT((*node)->ReadLog(),
              HasSubstr("\"event\":\"stopped_while_starting\",\"signal\":\"15\""));
}

// A second signal during the graceful stop ends the node at once: here the stop would wait for an
// etcd that answers nothing to take its hand-over, and Ctrl-C twice is an operator saying not
// to wait.
TEST_F(EtcdStartTest, ASecondSignalDuringTheGracefulStopEndsTheNodeAtOnce) {
  ASSERT_TRUE(etcd_->Restart().ok());
  auto node = StartNode({});
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE(AwaitOutput(**node, kServing)) << (*node)->ReadLog();
  ASSERT_TRUE(etcd_->Pause().ok());
  ASSERT_EQ(kill((*node)->pid(), SIGTERM), 0);
  ASSERT_TRUE(AwaitOutput(**node, "\"event\":\"shutting_down\"")) << (*node)->ReadLog();
  ASSERT_EQ(kill((*node)->pid(), SIGINT), 0);
  const absl::Time give_up = absl::Now() + kGiveUp;
  while ((*node)->Running() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE((*node)->Running()) << (*node)->ReadLog();
  EXPECT_EQ((*node)->exit_code(), 128 + SIGINT) << (*node)->ReadLog();
  EXPECT_THAT((*node)->ReadLog(),
              HasSubstr("\"event\":\"stopped_during_graceful_stop\",\"signal\":\"2\""));
  EXPECT_THAT((*node)->ReadLog(), ::testing::Not(HasSubstr("\"event\":\"handed_over\"")))
      << "the stop went on to its end";
}

}  // namespace
}  // namespace jobbroker::testing
