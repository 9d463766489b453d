#include "server/grpc/rpc_metrics.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "prometheus/registry.h"

namespace jobbroker::server {
namespace {

// method -> code -> sample count, for every series of jobbroker_rpc_duration_seconds.
std::map<std::string, std::map<std::string, uint64_t>> Counts(prometheus::Registry& registry) {
  std::map<std::string, std::map<std::string, uint64_t>> counts;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "jobbroker_rpc_duration_seconds") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string method, code;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "method") method = label.value;
        if (label.name == "code") code = label.value;
      }
      counts[method][code] = metric.histogram.sample_count;
    }
  }
  return counts;
}

const google::protobuf::FileDescriptor& BrokerProto() {
  return *v1::EnqueueRequest::descriptor()->file();
}

TEST(RpcMetricsTest, CountsEachMethodByStatusCode) {
  prometheus::Registry registry;
  RpcMetrics metrics(&registry);
  RpcServiceTimers timers = metrics.For(BrokerProto(), "Broker");
  timers.Start("Enqueue").Record(grpc::Status::OK);
  timers.Start("Enqueue").Record(grpc::Status::OK);
  timers.Start("Enqueue").Record(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "queue: empty"));
  timers.Start("Ack").Record(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job"));

  std::map<std::string, std::map<std::string, uint64_t>> want = {
      {"/jobbroker.v1.Broker/Enqueue", {{"OK", 2}, {"INVALID_ARGUMENT", 1}}},
      {"/jobbroker.v1.Broker/Ack", {{"NOT_FOUND", 1}}},
  };
  EXPECT_EQ(Counts(registry), want);
}

TEST(RpcMetricsTest, StreamsAreNotTimed) {
  prometheus::Registry registry;
  RpcMetrics metrics(&registry);
  RpcServiceTimers timers = metrics.For(BrokerProto(), "Broker");
  timers.Start("Work").Record(grpc::Status::OK);
  EXPECT_TRUE(Counts(registry).empty());
}

// EnqueueStream's batches each stand for an EnqueueBatch call: timed as calls of that method.
TEST(RpcMetricsTest, AStreamNamedAsTimedPerMessageIsTimedOncePerMessage) {
  prometheus::Registry registry;
  RpcMetrics metrics(&registry);
  RpcServiceTimers timers = metrics.For(BrokerProto(), "Broker", {"EnqueueStream"});
  timers.Start("EnqueueStream").Record(grpc::Status::OK);
  timers.Start("EnqueueStream").Record(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "x"));
  timers.Start("Work").Record(grpc::Status::OK);
  std::map<std::string, std::map<std::string, uint64_t>> want = {
      {"/jobbroker.v1.Broker/EnqueueStream", {{"OK", 1}, {"INVALID_ARGUMENT", 1}}},
  };
  EXPECT_EQ(Counts(registry), want);
  EXPECT_DEATH(metrics.For(BrokerProto(), "Broker", {"Enqueue"}),
               "jobbroker.v1.Broker has no bidirectional stream Enqueue");
}

TEST(RpcMetricsTest, OffRecordsNothingButStillKnowsTheMethods) {
  RpcMetrics metrics(nullptr);
  RpcServiceTimers timers = metrics.For(BrokerProto(), "Broker");
  timers.Start("Enqueue").Record(grpc::Status::OK);  // nowhere to record: must not crash
  EXPECT_DEATH(timers.Start("Enqueu"), "jobbroker.v1.Broker has no method Enqueu");
}

TEST(RpcMetricsTest, AMethodTheServiceLacksIsAWiringBug) {
  prometheus::Registry registry;
  RpcMetrics metrics(&registry);
  RpcServiceTimers timers = metrics.For(BrokerProto(), "Broker");
  EXPECT_DEATH(timers.Start("GetJob"), "jobbroker.v1.Broker has no method GetJob");
  EXPECT_DEATH(metrics.For(BrokerProto(), "Admin"),
               "jobbroker/v1/broker.proto declares no service Admin");
}

}  // namespace
}  // namespace jobbroker::server
