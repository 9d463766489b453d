// The binary's start-up options that need no running broker to judge (--check-config) and the
// gRPC listener's TLS and mutual TLS (--tls-cert, --tls-key, --tls-client-ca).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "jobbroker/v1/broker.grpc.pb.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/matchers.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::testing {
namespace {

class CheckConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
    data_dir_ = absl::StrCat(dir_->path(), "/data");
  }

  ExitResult Check(const std::string& json, std::vector<std::string> more_args = {}) {
    std::vector<std::string> args = {"--check-config", "--data-dir", data_dir_};
    if (!json.empty()) {
      absl::StatusOr<std::string> config = WriteConfig(*dir_, json);
      EXPECT_TRUE(config.ok()) << config.status();
      args.insert(args.end(), {"--config", config.value_or("")});
    }
    args.insert(args.end(), more_args.begin(), more_args.end());
    absl::StatusOr<ExitResult> result = RunBrokerToExit(*dir_, args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.value_or(ExitResult{.exit_code = -1});
  }

  std::unique_ptr<TempDir> dir_;
  std::string data_dir_;
};

TEST_F(CheckConfigTest, AGoodConfigIsAcceptedWithoutTouchingTheDataDir) {
  ExitResult result = Check(
      R"({"defaultPolicy":{"leaseDuration":"60s"},
          "queues":{"emails":{"maxConcurrency":5,"retry":{"maxAttempts":3}},"reports":{}}})");
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_THAT(result.stdout_text, HasSubstr("config ok"));
  EXPECT_THAT(result.stdout_text, HasSubstr("2 queue policies"));
  EXPECT_FALSE(std::filesystem::exists(data_dir_)) << "--check-config created the data dir";
}

TEST_F(CheckConfigTest, NoConfigMeansTheBuiltInDefaults) {
  ExitResult result = Check("");
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_THAT(result.stdout_text, HasSubstr("built-in defaults"));
}

TEST_F(CheckConfigTest, AnOutOfRangePolicyIsRefusedNamingTheQueueAndField) {
  ExitResult result = Check(R"({"queues":{"emails":{"leaseDuration":"0.010s"}}})");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr(R"(queues["emails"].lease_duration)"));
  EXPECT_THAT(result.stdout_text, Not(HasSubstr("config ok")));
}

TEST_F(CheckConfigTest, ACombinationOutOfBoundsIsRefused) {
  // Each value is fine alone; the queue's max_backoff under the default initial_backoff is not.
  ExitResult result = Check(R"({"defaultPolicy":{"retry":{"initialBackoff":"10s"}},
                                "queues":{"q":{"retry":{"maxBackoff":"5s"}}}})");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr(R"(queues["q"].retry.max_backoff)"));
}

TEST_F(CheckConfigTest, ABadQueueNameIsRefused) {
  ExitResult result = Check(R"({"queues":{"no spaces":{}}})");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr(R"(queues["no spaces"])"));
}

TEST_F(CheckConfigTest, AnUnknownFieldIsRefusedByName) {
  ExitResult result = Check(R"({"defaultPolicy":{"maxConcurency":2}})");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr("maxConcurency"));
}

TEST_F(CheckConfigTest, AMissingConfigFileIsRefused) {
  ExitResult result = Check("", {"--config", absl::StrCat(dir_->path(), "/nope.json")});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr("nope.json"));
}

TEST_F(CheckConfigTest, BadFlagsAreRefused) {
  EXPECT_THAT(Check("", {"--log-level", "loud"}).stderr_text, HasSubstr("--log-level"));
  ExitResult half_tls = Check("", {"--tls-cert", "/x.pem"});
  EXPECT_EQ(half_tls.exit_code, 1);
  EXPECT_THAT(half_tls.stderr_text, HasSubstr("--tls-cert and --tls-key go together"));
  ExitResult ca_only = Check("", {"--tls-client-ca", "/ca.pem"});
  EXPECT_EQ(ca_only.exit_code, 1);
  EXPECT_THAT(ca_only.stderr_text, HasSubstr("--tls-client-ca needs"));
  for (const char* bad : {"-1", "1000001", "many"}) {
    ExitResult r = Check("", {"--metrics-max-queues", bad});
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_THAT(r.stderr_text, HasSubstr("--metrics-max-queues must be a number from 0 to 1000000"))
        << bad;
  }
  EXPECT_EQ(Check("", {"--metrics-max-queues", "0"}).exit_code, 0) << "0: no limit";
}

TEST_F(CheckConfigTest, UnreadableOrNonPemTlsFilesAreRefusedNamingTheFlag) {
  absl::StatusOr<std::string> not_pem = dir_->WriteFile("cert.txt", "not a certificate");
  ASSERT_TRUE(not_pem.ok());
  ExitResult result = Check("", {"--tls-cert", *not_pem, "--tls-key", *not_pem});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.stderr_text, HasSubstr("--tls-cert"));
  EXPECT_THAT(result.stderr_text, HasSubstr("no PEM block"));
  ExitResult missing = Check("", {"--tls-cert", "/nonexistent/tls.crt", "--tls-key", *not_pem});
  EXPECT_THAT(missing.stderr_text, HasSubstr("/nonexistent/tls.crt: cannot be read"));
}

// The fixture's client() speaks plaintext, so it is of no use here: each call makes a channel
// with the credentials it tests.
class TlsTest : public TlsBrokerFixture {
 protected:
  BrokerProcessOptions TlsOptions(bool mutual) const {
    return TlsBrokerFixture::TlsOptions("tls", mutual);
  }

  // One Enqueue over `credentials`, with a short deadline: a refused handshake shows as
  // UNAVAILABLE rather than a hang.
  grpc::Status Enqueue(const std::string& address,
                       std::shared_ptr<grpc::ChannelCredentials> credentials) {
    auto stub = v1::Broker::NewStub(grpc::CreateChannel(address, credentials));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::EnqueueRequest req;
    req.set_queue("tls");
    req.set_payload("x");
    v1::EnqueueResponse resp;
    grpc::Status status = stub->Enqueue(&ctx, req, &resp);
    if (status.ok() && resp.job_id().empty()) return grpc::Status(grpc::INTERNAL, "no job id");
    return status;
  }

  std::shared_ptr<grpc::ChannelCredentials> TrustingCa(bool with_client_cert) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = pki_.ca_pem;
    if (with_client_cert) {
      options.pem_cert_chain = pki_.client_cert_pem;
      options.pem_private_key = pki_.client_key_pem;
    }
    return grpc::SslCredentials(options);
  }
};

TEST_F(TlsTest, ServesOverTlsAndRefusesPlaintext) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsOptions(/*mutual=*/false)));
  grpc::Status tls = Enqueue(process().address(), TrustingCa(false));
  EXPECT_TRUE(tls.ok()) << tls.error_message();
  grpc::Status plaintext = Enqueue(process().address(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(plaintext.error_code(), grpc::UNAVAILABLE) << plaintext.error_message();
  // A client that does not trust the server's CA does not get through either.
  grpc::Status untrusted = Enqueue(process().address(), grpc::SslCredentials({}));
  EXPECT_EQ(untrusted.error_code(), grpc::UNAVAILABLE) << untrusted.error_message();
  EXPECT_EQ(process().Terminate().value_or(-1), 0);
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsOptions(/*mutual=*/true)));
  grpc::Status with_cert = Enqueue(process().address(), TrustingCa(true));
  EXPECT_TRUE(with_cert.ok()) << with_cert.error_message();
  grpc::Status without_cert = Enqueue(process().address(), TrustingCa(false));
  EXPECT_EQ(without_cert.error_code(), grpc::UNAVAILABLE) << without_cert.error_message();
  EXPECT_EQ(process().Terminate().value_or(-1), 0);
}

}  // namespace
}  // namespace jobbroker::testing
