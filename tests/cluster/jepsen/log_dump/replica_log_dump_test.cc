// replica_log_dump on real data dirs: a real etcd and three real nodes take jobs and stop; the
// dump of each node's data dir and each node's own stderr then feed the crash checker's writer
// check (tests/crash/checker.h), which must find one writer per epoch and logs that agree, and
// must catch a dump altered to disagree.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/crash/checker.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/process_util.h"

#ifndef LOG_DUMP_BINARY
#error "LOG_DUMP_BINARY must name the replica_log_dump binary (CMakeLists.txt defines it)"
#endif

namespace jobbroker::testing {
namespace {

using crash::CrashLogs;
using crash::Report;
using crash::ViolationKind;
using ::testing::Contains;
using ::testing::IsEmpty;

constexpr int kNodes = 3;
constexpr uint32_t kPartitions = 2;
constexpr int kJobsPerPartition = 10;
// How long a step may take before the test gives up on it (never asserted as a bound).
constexpr absl::Duration kGiveUp = absl::Seconds(60);

struct Dump {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the dump tool on `data_dir`, its stdout and stderr kept apart in files of `work`.
absl::StatusOr<Dump> RunDump(const TempDir& work, const std::string& name,
                             std::vector<std::string> args) {
  ChildStreams streams;
  streams.stdout_path = absl::StrCat(work.path(), "/", name, ".dump");
  streams.stderr_path = absl::StrCat(work.path(), "/", name, ".err");
  streams.truncate = true;
  args.insert(args.begin(), LOG_DUMP_BINARY);
  absl::StatusOr<pid_t> pid = SpawnChild(std::move(args), streams);
  if (!pid.ok()) return pid.status();
  absl::StatusOr<int> status = WaitPid(*pid, kGiveUp);
  if (!status.ok()) {
    KillAndReap(*pid);
    return status.status();
  }
  return Dump{ExitCodeOf(*status), ReadWholeFile(streams.stdout_path),
              ReadWholeFile(streams.stderr_path)};
}

// One queue of each partition.
std::vector<std::string> QueuePerPartition() {
  std::map<uint32_t, std::string> queues;
  for (int i = 0; queues.size() < kPartitions; ++i) {
    const std::string queue = absl::StrCat("dump-", i);
    queues.emplace(core::PartitionOfQueue(queue, kPartitions), queue);
  }
  std::vector<std::string> out;
  for (const auto& [partition, queue] : queues) out.push_back(queue);
  return out;
}

class ReplicaLogDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = StartTestCluster(kNodes, kPartitions);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    auto work = TempDir::Create();
    ASSERT_TRUE(work.ok()) << work.status();
    work_ = *std::move(work);
  }

  // Enqueues at node 0 (it forwards to the partition's leader), again while the cluster is
  // still electing (UNAVAILABLE); false after kGiveUp.
  bool Enqueue(const std::string& queue, const std::string& payload) {
    BrokerClient client(cluster_.nodes[0]->NewChannel(), absl::Seconds(5));
    v1::EnqueueRequest request;
    request.set_queue(queue);
    request.set_payload(payload);
    const absl::Time give_up = absl::Now() + kGiveUp;
    while (absl::Now() < give_up) {
      v1::EnqueueResponse response;
      if (client.Enqueue(request, &response).ok()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  TestCluster cluster_;
  std::unique_ptr<TempDir> work_;
};

TEST_F(ReplicaLogDumpTest, StoppedNodesLogsHoldOneEntryPerSeqAndEpochAndOneLeaderPerEpoch) {
  for (const std::string& queue : QueuePerPartition()) {
    for (int i = 0; i < kJobsPerPartition; ++i) {
      ASSERT_TRUE(Enqueue(queue, absl::StrCat("job ", i)))
          << "no node took a write to " << queue << "; node 0's log:\n"
          << cluster_.nodes[0]->ReadStderr();
    }
  }
  for (auto& node : cluster_.nodes) {
    absl::StatusOr<int> code = node->Terminate();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << node->ReadStderr();
  }

  CrashLogs logs;
  std::vector<std::string> dumps;
  for (int n = 0; n < kNodes; ++n) {
    const std::string node = absl::StrCat("node-", n);
    absl::StatusOr<Dump> dump =
        RunDump(*work_, node, {"--data-dir", cluster_.nodes[n]->data_dir()});
    ASSERT_TRUE(dump.ok()) << dump.status();
    ASSERT_EQ(dump->exit_code, 0) << dump->err;
    EXPECT_THAT(dump->err, IsEmpty());
    crash::ParseReplicaLogDump(node, dump->out, logs);
    crash::ParseNodeLog(node, cluster_.nodes[n]->ReadStderr(), logs);
    dumps.push_back(dump->out);
  }
  EXPECT_THAT(logs.malformed, IsEmpty());
  EXPECT_EQ(logs.torn_lines, 0);
  EXPECT_EQ(logs.replica_logs.size(), kNodes * kPartitions) << dumps[0];

  const Report report = crash::Check(logs, {});
  EXPECT_TRUE(report.ok()) << report.ViolationList() << dumps[0] << dumps[1] << dumps[2];
  // Every job was committed on two nodes at least, so the logs overlap.
  EXPECT_GE(report.summary.replica_entries, kNodes * kPartitions * kJobsPerPartition / 2);
  EXPECT_GT(report.summary.entries_compared, 0);
  // Each partition was led, and each node said so in its own log.
  std::set<uint32_t> led;
  for (const crash::PartitionRoleRecord& r : logs.partition_roles) {
    if (r.role == "leader" && r.epoch > 0) led.insert(r.partition);
  }
  EXPECT_EQ(led.size(), kPartitions);
  EXPECT_EQ(report.summary.partitions_led, kPartitions);

  // One digest changed in a copy of node-1's dump, at an entry node-0 holds too.
  std::set<std::tuple<uint32_t, uint64_t, int64_t>> on_node_0;
  for (const crash::ReplicaLogEntry& e : logs.replica_entries) {
    if (e.node == "node-0") on_node_0.insert({e.partition, e.seq, e.epoch});
  }
  const crash::ReplicaLogEntry* shared = nullptr;
  for (const crash::ReplicaLogEntry& e : logs.replica_entries) {
    if (e.node == "node-1" && on_node_0.contains({e.partition, e.seq, e.epoch})) {
      shared = &e;
      break;
    }
  }
  ASSERT_NE(shared, nullptr) << dumps[0] << dumps[1];
  const std::string line =
      absl::StrCat(shared->partition, "\t", shared->seq, "\t", shared->epoch, "\t");
  std::string altered_digest = shared->digest;
  altered_digest.back() = altered_digest.back() == '0' ? '1' : '0';
  const std::string altered = absl::StrReplaceAll(
      dumps[1],
      {{absl::StrCat(line, shared->digest, "\n"), absl::StrCat(line, altered_digest, "\n")}});
  ASSERT_NE(altered, dumps[1]);

  CrashLogs tampered;
  crash::ParseReplicaLogDump("node-0", dumps[0], tampered);
  crash::ParseReplicaLogDump("node-1", altered, tampered);
  crash::ParseReplicaLogDump("node-2", dumps[2], tampered);
  const Report caught = crash::Check(tampered, {});
  std::vector<ViolationKind> kinds;
  for (const crash::Violation& v : caught.violations) kinds.push_back(v.kind);
  EXPECT_THAT(kinds, Contains(ViolationKind::kTwoWritersInEpoch)) << caught.ViolationList();
}

TEST_F(ReplicaLogDumpTest, FailsWithExitTwoOnARunningNodeOrADirWithoutAStore) {
  absl::StatusOr<Dump> running =
      RunDump(*work_, "running", {"--data-dir", cluster_.nodes[0]->data_dir()});
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->exit_code, 2) << running->out;
  EXPECT_THAT(running->err, ::testing::HasSubstr("replica_log_dump:"));

  absl::StatusOr<Dump> empty = RunDump(*work_, "empty", {"--data-dir", work_->path()});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->exit_code, 2);
  EXPECT_THAT(empty->err, ::testing::HasSubstr("holds no jobbroker store"));

  absl::StatusOr<Dump> usage = RunDump(*work_, "usage", {});
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->exit_code, 2);
  EXPECT_THAT(usage->err, ::testing::HasSubstr("usage"));
}

}  // namespace
}  // namespace jobbroker::testing
