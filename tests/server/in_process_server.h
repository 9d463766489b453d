#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "node/partitions.h"
#include "server/grpc/admin_service.h"
#include "server/grpc/broker_service.h"
#include "server/grpc/rpc_auth.h"
#include "server/grpc/rpc_metrics.h"
#include "server/grpc/work_stream_limit.h"
#include "server/routing/router.h"
#include "storage/memory_store.h"
#include "tests/testing/fake_clock.h"

namespace jobbroker::server {

using ::jobbroker::testing::FakeClock;

// The broker's gRPC services wired as main.cc wires them (BrokerService, and through it the Work
// stream reactor, and AdminService) on real brokers (node::Partitions) over MemoryStore with a
// FakeClock, served by a grpc::Server that listens on no port: clients reach it through channel().
// Commits run on the broker's writer thread as in production, so a reply comes once its change is
// durable. Nothing ticks by itself: a test moves clock() and calls broker().Tick(). No auth, no
// metrics registry.
class InProcessServer {
 public:
  static constexpr absl::Duration kCallTimeout = absl::Seconds(30);

  // `partitions`: how many the broker has (node::Partitions); its queues spread over them. The
  // default is 1, or JOBBROKER_TEST_PARTITIONS (tests/server/CMakeLists.txt runs suites again
  // with several).
  explicit InProcessServer(int max_work_streams = 100, uint32_t partitions = DefaultPartitions())
      : clock_(absl::FromUnixSeconds(1'800'000'000)),
        streams_(max_work_streams),
        rpc_metrics_(nullptr) {
    core::BrokerOptions options;
    options.commit_mode = core::CommitPipeline::Mode::kBackground;
    options.uniform = [] { return 0.5; };  // jitter: the middle of the range
    broker_ = *node::Partitions::Open(store_, clock_, partitions, options);
    auth_ = std::make_unique<RpcAuth>(nullptr, *broker_);
    router_ = Router::SingleNode("local", partitions);
    broker_service_ = std::make_unique<BrokerService>(*broker_, *auth_, streams_, rpc_metrics_,
                                                      *router_, /*forwarder=*/nullptr);
    admin_service_ = std::make_unique<AdminService>(*broker_, *auth_, rpc_metrics_, *router_,
                                                    /*forwarder=*/nullptr);
    grpc::ServerBuilder builder;
    builder.RegisterService(broker_service_.get());
    builder.RegisterService(admin_service_.get());
    server_ = builder.BuildAndStart();
    channel_ = server_->InProcessChannel(grpc::ChannelArguments());
  }

  // As main.cc shuts down: the broker first (open Work streams end), then the server.
  ~InProcessServer() {
    broker_->Shutdown();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    server_.reset();
    broker_.reset();
  }

  static uint32_t DefaultPartitions() {
    const char* env = std::getenv("JOBBROKER_TEST_PARTITIONS");
    return env == nullptr ? 1 : static_cast<uint32_t>(std::atoi(env));
  }

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::unique_ptr<v1::Broker::Stub> NewBrokerStub() const { return v1::Broker::NewStub(channel_); }
  std::unique_ptr<v1::Admin::Stub> NewAdminStub() const { return v1::Admin::NewStub(channel_); }
  node::Partitions& broker() { return *broker_; }
  FakeClock& clock() { return clock_; }
  const WorkStreamLimit& work_streams() const { return streams_; }

  // A client context whose deadline turns a hang into a failure rather than a stalled test.
  static void SetDeadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  }

 private:
  FakeClock clock_;
  storage::MemoryStore store_;
  WorkStreamLimit streams_;
  RpcMetrics rpc_metrics_;
  std::unique_ptr<node::Partitions> broker_;
  std::unique_ptr<RpcAuth> auth_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<BrokerService> broker_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace jobbroker::server
