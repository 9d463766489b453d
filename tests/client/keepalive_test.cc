// Keepalive on both ends of a connection, against the real broker binary: the broker gives up a
// worker that stopped answering (its process stopped with SIGSTOP), and the C++ worker gives up a
// broker that stopped answering and comes back once it answers again. TCP notices neither: a
// stopped process's kernel still acknowledges every segment, as a frozen VM's or a half-open
// connection's peer may.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/worker.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/child_process.h"

#ifndef JOBBROKER_EMAIL_WORKER_BINARY
#error "JOBBROKER_EMAIL_WORKER_BINARY must name the example worker's binary"
#endif

namespace jobbroker::testing {
namespace {

using ::testing::HasSubstr;

// The workers connected to the broker, by id, with the address they call from.
std::vector<v1::WorkerInfo> Workers(v1::Admin::Stub& admin) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  if (!admin.ListWorkers(&ctx, req, &resp).ok()) return {};
  return {resp.workers().begin(), resp.workers().end()};
}

// The port in a ListWorkers peer ("ipv4:127.0.0.1:PORT"); 0 if there is none.
int PeerPort(absl::string_view peer) {
  int port = 0;
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(peer.substr(colon + 1), &port))
    return 0;
  return port;
}

// Whether a TCP connection from local port `from` to port `to` on loopback is ESTABLISHED, as
// the kernel lists it in /proc/net/tcp (hex ports; state 01 is ESTABLISHED).
bool Established(int from, int to) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (fields.size() < 4) continue;
      const absl::string_view local = fields[1], remote = fields[2], state = fields[3];
      auto port_of = [](absl::string_view endpoint) {
        int port = 0;
        const size_t colon = endpoint.rfind(':');
        if (colon != absl::string_view::npos)
          (void)absl::SimpleHexAtoi(endpoint.substr(colon + 1), &port);
        return port;
      };
      if (port_of(local) == from && port_of(remote) == to && state == "01") return true;
    }
  }
  return false;
}

class KeepaliveTest : public BrokerFixture {
 protected:
  // Pings each second, a second's wait for the answer: a silent worker is dropped within a few
  // seconds rather than the default's fifteen.
  KeepaliveTest()
      : BrokerFixture(BrokerProcessOptions{
            .extra_args = {"--keepalive-time", "1", "--keepalive-timeout", "1"}}) {}

  int BrokerPort() const { return PeerPort(process().address()); }
};

TEST_F(KeepaliveTest, TheBrokerDropsAWorkerThatStoppedAnswering) {
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<ChildProcess>> worker =
      ChildProcess::Start({"/usr/bin/env", absl::StrCat("JOBBROKER_ADDRESS=", process().address()),
                           JOBBROKER_EMAIL_WORKER_BINARY},
                          (*dir)->path() + "/worker.log");
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(WaitFor([&] { return Workers(admin()).size() == 1; }));

  // The worker's process stops: its kernel keeps the connection up, but nothing answers the
  // broker's pings.
  ASSERT_TRUE((*worker)->Pause().ok());
  EXPECT_TRUE(WaitFor([&] { return Workers(admin()).empty(); }))
      << "a worker that answers no ping is still listed";

  // Continued, it finds its stream gone and connects again on its own.
  ASSERT_TRUE((*worker)->Continue().ok());
  EXPECT_TRUE(WaitFor([&] { return Workers(admin()).size() == 1; })) << (*worker)->ReadLog();
}

TEST_F(KeepaliveTest, AWorkerGivesUpABrokerThatStoppedAnsweringAndComesBack) {
  std::atomic<int> ran{0};
  client::WorkerOptions options;
  options.address = process().address();
  options.worker_id = "keepalive-worker";
  options.keepalive = {.time = absl::Seconds(1), .timeout = absl::Seconds(1)};
  // 2 s leases: should the job after the thaw go to a connection the worker tried while the
  // broker was frozen, and closed just as the broker answered it, it comes back in seconds.
  options.lease_duration = absl::Seconds(2);
  client::Worker worker(options);
  worker.Handle("q", [&](client::JobContext&) {
    ++ran;
    return absl::OkStatus();
  });
  ASSERT_TRUE(worker.Start().ok());
  int port = 0;
  ASSERT_TRUE(WaitFor([&] {
    std::vector<v1::WorkerInfo> workers = Workers(admin());
    port = workers.size() == 1 ? PeerPort(workers[0].peer()) : 0;
    return port != 0;
  }));
  ASSERT_TRUE(Established(port, BrokerPort())) << "the worker's connection is not where expected";

  ASSERT_EQ(kill(process().pid(), SIGSTOP), 0);
  // The broker's kernel still acknowledges every segment; only the unanswered pings tell.
  const bool gave_up = WaitFor([&] { return !Established(port, BrokerPort()); });
  ASSERT_EQ(kill(process().pid(), SIGCONT), 0);
  EXPECT_TRUE(gave_up) << "the worker still holds its connection to a broker that answers nothing";

  // Back on a new connection, it runs what comes.
  client().MustEnqueue("q");
  EXPECT_TRUE(WaitFor([&] { return ran.load() == 1; }));
  worker.Stop();
}

TEST(KeepaliveOptionsTest, ABadKeepaliveIsRefusedNamingTheField) {
  EXPECT_TRUE(client::ValidateKeepalive({}).ok());
  EXPECT_TRUE(client::ValidateKeepalive({.time = absl::ZeroDuration()}).ok()) << "off";
  EXPECT_THAT(client::ValidateKeepalive({.time = absl::Seconds(-1)}).message(),
              HasSubstr("keepalive.time must not be negative"));
  EXPECT_THAT(client::ValidateKeepalive({.time = absl::Seconds(1), .timeout = absl::ZeroDuration()})
                  .message(),
              HasSubstr("keepalive.timeout must be 1ms to 1h"));

  client::ClientOptions bad_client;
  bad_client.address = "127.0.0.1:1";
  bad_client.keepalive.timeout = absl::Hours(2);
  EXPECT_THROW(client::Client{bad_client}, std::invalid_argument);

  client::WorkerOptions bad_worker;
  bad_worker.address = "127.0.0.1:1";
  bad_worker.keepalive.time = absl::Seconds(-5);
  client::Worker worker(bad_worker);
  worker.Handle("q", [](client::JobContext&) { return absl::OkStatus(); });
  absl::Status started = worker.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(started.message(), HasSubstr("keepalive.time"));
}

}  // namespace
}  // namespace jobbroker::testing
