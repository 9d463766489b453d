#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::testing {

// The fixture of the end-to-end tests: the real jobbroker binary (BrokerProcess) and a
// BrokerClient to it, with the restart and wait helpers every suite needs. What differs between
// suites (a config, extra flags such as --auth-tokens or TLS files) is a BrokerProcessOptions:
//
//   class StreamTest : public BrokerFixture {
//    protected:
//     StreamTest() : BrokerFixture({.config_json = kConfig}) {}
//   };
//
// By default SetUp() starts the broker, so a test body finds it serving. A suite whose tests
// each need their own options passes kStartInTest and calls Start() in the test.
//
// The broker gets SIGKILL when the fixture dies (BrokerProcess's destructor). One test thread
// drives Start/Restart; the client and stubs are thread-safe between those calls.
class BrokerFixture : public ::testing::Test {
 public:
  // Passed instead of options: SetUp() starts nothing.
  static constexpr std::nullopt_t kStartInTest = std::nullopt;

  // Longest wait of WaitFor() when the test names none: long enough never to cut short a wait on
  // a loaded machine (a failed wait fails the test; a met one returns at once).
  static constexpr absl::Duration kWaitDeadline = absl::Seconds(30);

  // Polls `condition` every 20 ms until it holds or `timeout` passes; returns its last value.
  // Synchronisation on something no RPC can wait for (a lease running out, a worker thread
  // acting on its own); never a measurement of how long it took.
  static bool WaitFor(const std::function<bool()>& condition,
                      absl::Duration timeout = kWaitDeadline);

 protected:
  // SetUp() starts a broker with the default options, or with `options`, or (kStartInTest)
  // nothing.
  BrokerFixture() : BrokerFixture(BrokerProcessOptions{}) {}
  explicit BrokerFixture(BrokerProcessOptions options);
  explicit BrokerFixture(std::nullopt_t);

  void SetUp() override;

  // Starts a broker with `options` (one already running is killed first) and connects to it.
  // A broker that does not start is a fatal failure of the test: in a test body, call it as
  // ASSERT_NO_FATAL_FAILURE(Start(...)).
  void Start(BrokerProcessOptions options = {});
  // SIGTERM, start again on the same data dir and config, reconnect (the port changes). A fatal
  // failure if it does not come back: ASSERT_NO_FATAL_FAILURE(Restart()).
  void Restart();
  // SIGKILL (nothing flushed), then as Restart().
  void Kill9AndRestart();
  // A new client and stubs to the current port, for a test that restarts process() itself.
  void Reconnect();

  bool started() const { return process_ != nullptr; }
  // The running broker; only after a successful Start() (or SetUp()).
  BrokerProcess& process() const { return *process_; }
  // The client with deadlines and Must helpers (tests/testing/broker_client.h).
  BrokerClient& client() const { return *client_; }
  // The raw stubs, for calls with a context of the test's own (metadata, streams).
  jobbroker::v1::Broker::Stub& broker() const { return client_->broker(); }
  jobbroker::v1::Admin::Stub& admin() const { return client_->admin(); }

 private:
  const std::optional<BrokerProcessOptions> set_up_options_;
  std::unique_ptr<BrokerProcess> process_;
  std::unique_ptr<BrokerClient> client_;
};

// BrokerFixture for TEST_P suites. A suite whose options depend on the parameter passes
// kStartInTest and overrides SetUp() to Start() with the options GetParam() names.
template <typename T>
class BrokerFixtureWithParam : public BrokerFixture, public ::testing::WithParamInterface<T> {
 protected:
  using BrokerFixture::BrokerFixture;
};

// BrokerFixture for the TLS suites: a temp dir with a throwaway CA and the server's and a client's
// certificates (test_pki.h), made before each test. Starts nothing: a test starts the broker with
// TlsOptions (or runs it to exit, in dir_).
class TlsBrokerFixture : public BrokerFixture {
 protected:
  TlsBrokerFixture() : BrokerFixture(kStartInTest) {}

  void SetUp() override;

  // The server's certificate on the listener `prefix` names: "tls" (gRPC: --tls-cert, --tls-key)
  // or "http-tls" (HTTP); with `mutual`, client certificates signed by the CA are required too.
  BrokerProcessOptions TlsOptions(absl::string_view prefix, bool mutual) const;

  std::unique_ptr<TempDir> dir_;
  TestPki pki_;
};

}  // namespace jobbroker::testing
