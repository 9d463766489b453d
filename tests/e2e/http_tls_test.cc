// The HTTP endpoint (/metrics, /healthz, /readyz) over TLS and mutual TLS (--http-tls-cert,
// --http-tls-key, --http-tls-client-ca), with a throwaway CA; curl plays the scraper.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/matchers.h"
#include "tests/testing/test_pki.h"

namespace jobbroker::testing {
namespace {

class HttpTlsTest : public TlsBrokerFixture {
 protected:
  BrokerProcessOptions TlsOptions(bool mutual) const {
    return TlsBrokerFixture::TlsOptions("http-tls", mutual);
  }

  // curl's exit code and output for GET `url` with `extra` options (never retried, 10 s at most).
  CommandResult Curl(const std::string& url, std::vector<std::string> extra) {
    std::vector<std::string> argv = {"/usr/bin/curl", "--silent",   "--show-error",
                                     "--fail",        "--max-time", "10"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(url);
    absl::StatusOr<CommandResult> run = RunCommand(dir_->path(), argv);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *run : CommandResult{.exit_code = -1};
  }
};

TEST_F(HttpTlsTest, ServesMetricsAndProbesOverHttpsOnly) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsOptions(/*mutual=*/false)));
  const std::string https = absl::StrCat("https://", process().http_address());
  CommandResult metrics = Curl(https + "/metrics", {"--cacert", pki_.ca_cert});
  EXPECT_EQ(metrics.exit_code, 0) << metrics.output;
  EXPECT_THAT(metrics.output, HasSubstr("jobbroker_"));
  CommandResult ready = Curl(https + "/readyz", {"--cacert", pki_.ca_cert});
  EXPECT_EQ(ready.exit_code, 0) << ready.output;
  EXPECT_THAT(ready.output, HasSubstr("ready"));

  // Plain HTTP to the TLS port gets no metrics, and neither does a client that does not trust
  // the CA (curl: 60 = the peer's certificate cannot be verified).
  CommandResult plain = Curl(absl::StrCat("http://", process().http_address(), "/metrics"), {});
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_THAT(plain.output, Not(HasSubstr("jobbroker_")));
  CommandResult untrusted = Curl(https + "/metrics", {});
  EXPECT_EQ(untrusted.exit_code, 60) << untrusted.output;
  // TLS 1.1 and older are refused (curl: 35 = the handshake failed).
  CommandResult old = Curl(https + "/metrics", {"--cacert", pki_.ca_cert, "--tls-max", "1.1"});
  EXPECT_NE(old.exit_code, 0) << old.output;
  EXPECT_EQ(process().Terminate().value_or(-1), 0);
}

TEST_F(HttpTlsTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  ASSERT_NO_FATAL_FAILURE(Start(TlsOptions(/*mutual=*/true)));
  const std::string url = absl::StrCat("https://", process().http_address(), "/metrics");
  CommandResult with_cert =
      Curl(url, {"--cacert", pki_.ca_cert, "--cert", pki_.client_cert, "--key", pki_.client_key});
  EXPECT_EQ(with_cert.exit_code, 0) << with_cert.output;
  EXPECT_THAT(with_cert.output, HasSubstr("jobbroker_"));
  CommandResult without_cert = Curl(url, {"--cacert", pki_.ca_cert});
  EXPECT_NE(without_cert.exit_code, 0) << without_cert.output;
  EXPECT_THAT(without_cert.output, Not(HasSubstr("jobbroker_")));
  // A certificate from another CA is refused as well: the server's own is not a client's.
  absl::StatusOr<std::unique_ptr<TempDir>> other_dir = TempDir::Create();
  ASSERT_TRUE(other_dir.ok());
  absl::StatusOr<TestPki> other = MakePki(**other_dir);
  ASSERT_TRUE(other.ok()) << other.status();
  CommandResult foreign = Curl(
      url, {"--cacert", pki_.ca_cert, "--cert", other->client_cert, "--key", other->client_key});
  EXPECT_NE(foreign.exit_code, 0) << foreign.output;
  EXPECT_EQ(process().Terminate().value_or(-1), 0);
}

TEST_F(HttpTlsTest, BadFilesAreRefusedAtStartNamingTheFlag) {
  ExitResult half = RunBrokerToExit(*dir_, {"--check-config", "--http-tls-cert", "/x.pem"})
                        .value_or(ExitResult{});
  EXPECT_EQ(half.exit_code, 1);
  EXPECT_THAT(half.stderr_text, HasSubstr("--http-tls-cert and --http-tls-key go together"));

  absl::StatusOr<std::string> not_pem = dir_->WriteFile("cert.txt", "not a certificate");
  ASSERT_TRUE(not_pem.ok());
  ExitResult garbage = RunBrokerToExit(*dir_, {"--check-config", "--http-tls-cert", *not_pem,
                                               "--http-tls-key", pki_.server_key})
                           .value_or(ExitResult{});
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_THAT(garbage.stderr_text, HasSubstr("--http-tls-cert " + *not_pem));

  // The client's key with the server's certificate: each file is fine, the pair is not.
  ExitResult mismatch =
      RunBrokerToExit(*dir_, {"--check-config", "--http-tls-cert", pki_.server_cert,
                              "--http-tls-key", pki_.client_key})
          .value_or(ExitResult{});
  EXPECT_EQ(mismatch.exit_code, 1);
  EXPECT_THAT(mismatch.stderr_text, HasSubstr("--http-tls-key " + pki_.client_key));
  EXPECT_THAT(mismatch.stderr_text, HasSubstr("mismatch"));

  ExitResult good = RunBrokerToExit(*dir_, {"--check-config", "--http-tls-cert", pki_.server_cert,
                                            "--http-tls-key", pki_.server_key,
                                            "--http-tls-client-ca", pki_.ca_cert})
                        .value_or(ExitResult{});
  EXPECT_EQ(good.exit_code, 0) << good.stderr_text;
  EXPECT_THAT(good.stdout_text, HasSubstr("HTTP over mutual TLS"));
}

}  // namespace
}  // namespace jobbroker::testing
