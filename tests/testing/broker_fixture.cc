#include "tests/testing/broker_fixture.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace jobbroker::testing {

bool BrokerFixture::WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  return PollUntil(condition, timeout);
}

BrokerFixture::BrokerFixture(BrokerProcessOptions options) : set_up_options_(std::move(options)) {}

BrokerFixture::BrokerFixture(std::nullopt_t) : set_up_options_(std::nullopt) {}

void BrokerFixture::SetUp() {
  if (set_up_options_.has_value()) Start(*set_up_options_);
}

void BrokerFixture::Start(BrokerProcessOptions options) {
  client_.reset();
  process_.reset();
  absl::StatusOr<std::unique_ptr<BrokerProcess>> process = BrokerProcess::Start(std::move(options));
  ASSERT_TRUE(process.ok()) << process.status();
  process_ = *std::move(process);
  Reconnect();
}

void BrokerFixture::Restart() {
  ASSERT_TRUE(started()) << "Restart() before Start()";
  const absl::Status restarted = process_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  Reconnect();
}

void BrokerFixture::Kill9AndRestart() {
  ASSERT_TRUE(started()) << "Kill9AndRestart() before Start()";
  process_->Kill9();
  Restart();
}

void BrokerFixture::Reconnect() {
  client_ = std::make_unique<BrokerClient>(process_->NewChannel());
}

void TlsBrokerFixture::SetUp() {
  BrokerFixture::SetUp();
  absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  dir_ = *std::move(dir);
  absl::StatusOr<TestPki> pki = MakePki(*dir_);
  ASSERT_TRUE(pki.ok()) << pki.status();
  pki_ = *std::move(pki);
}

BrokerProcessOptions TlsBrokerFixture::TlsOptions(absl::string_view prefix, bool mutual) const {
  BrokerProcessOptions options;
  options.extra_args = {absl::StrCat("--", prefix, "-cert"), pki_.server_cert,
                        absl::StrCat("--", prefix, "-key"), pki_.server_key};
  if (mutual) {
    options.extra_args.push_back(absl::StrCat("--", prefix, "-client-ca"));
    options.extra_args.push_back(pki_.ca_cert);
  }
  return options;
}

}  // namespace jobbroker::testing
