// A real Prometheus scrapes the real broker: the metric names, labels and values an operator's
// queries and alerts/*.yml depend on, as Prometheus itself parses and stores them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_client.h"

#ifndef JOBBROKER_SOURCE_DIR
#error "JOBBROKER_SOURCE_DIR must name the source tree (for deploy/prometheus/alerts.yml)"
#endif

namespace jobbroker::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// $PROMETHEUS_BINARY, else Debian's.
std::string PrometheusBinary() {
  const char* env = std::getenv("PROMETHEUS_BINARY");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/prometheus";
}

// A port that was free a moment ago. Prometheus cannot listen on port 0 and report the port it
// got, so this is the one way to run it without a fixed port; the race with another process
// taking the port in between is accepted.
absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("bind to 127.0.0.1:0 failed");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Prometheus as a child process: scrapes one target as job "jobbroker" every second and
// evaluates deploy/prometheus/alerts.yml every second. Its TSDB and log are in a temp dir.
class PrometheusProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(const std::string& target) {
    absl::StatusOr<std::unique_ptr<TempDir>> dir = TempDir::Create();
    if (!dir.ok()) return dir.status();
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    const std::string config = absl::StrCat(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "rule_files:\n"
        "  - ",
        JOBBROKER_SOURCE_DIR, "/deploy/prometheus/alerts.yml\n",
        "scrape_configs:\n"
        "  - job_name: jobbroker\n"
        "    static_configs:\n"
        "      - targets: ['",
        target, "']\n");
    absl::StatusOr<std::string> config_path = (*dir)->WriteFile("prometheus.yml", config);
    if (!config_path.ok()) return config_path.status();
    std::unique_ptr<PrometheusProcess> prometheus(
        new PrometheusProcess(*std::move(dir), absl::StrCat("127.0.0.1:", *port)));
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
        {PrometheusBinary(), absl::StrCat("--config.file=", *config_path),
         absl::StrCat("--storage.tsdb.path=", prometheus->dir_->path(), "/tsdb"),
         absl::StrCat("--web.listen-address=", prometheus->address_)},
        absl::StrCat(prometheus->dir_->path(), "/prometheus.log"));
    if (!child.ok()) return child.status();
    prometheus->child_ = *std::move(child);
    if (absl::Status s = prometheus->WaitUntilReady(); !s.ok()) return s;
    return prometheus;
  }

  ~PrometheusProcess() {
    // Stop it before its temp dir (TSDB, log) goes.
    if (child_ != nullptr) (void)child_->Stop();
  }

  const std::string& address() const { return address_; }
  std::string Log() const { return child_->ReadLog(); }

  // GET `path` of the HTTP API; the JSON answer's "data" when "status" is "success".
  absl::StatusOr<Value> Api(const std::string& path) const {
    absl::StatusOr<HttpResponse> response = HttpGetResponse(address_, path, absl::Seconds(10));
    if (!response.ok()) return response.status();
    Struct json;
    if (!google::protobuf::util::JsonStringToMessage(response->body, &json).ok()) {
      return absl::InternalError(
          absl::StrCat("GET ", path, ": not JSON (HTTP ", response->status, "): ", response->body));
    }
    auto status = json.fields().find("status");
    auto data = json.fields().find("data");
    if (status == json.fields().end() || status->second.string_value() != "success" ||
        data == json.fields().end()) {
      return absl::InternalError(absl::StrCat("GET ", path, ": ", response->body));
    }
    return data->second;
  }

  // The value of an instant query whose result is one sample (a sum(...), say); nullopt when
  // the result is empty (no such series yet).
  absl::StatusOr<std::optional<double>> QueryValue(const std::string& promql) const {
    absl::StatusOr<Value> data = Api(absl::StrCat("/api/v1/query?query=", UrlEncode(promql)));
    if (!data.ok()) return data.status();
    // {"resultType":"vector","result":[{"metric":{...},"value":[<time>,"<value>"]}]}
    const auto& result = data->struct_value().fields().find("result");
    if (result == data->struct_value().fields().end()) {
      return absl::InternalError(absl::StrCat(promql, ": no result"));
    }
    const auto& samples = result->second.list_value().values();
    if (samples.empty()) return std::nullopt;
    if (samples.size() != 1) {
      return absl::InternalError(absl::StrCat(promql, ": ", samples.size(), " samples, not one"));
    }
    const auto& value = samples[0].struct_value().fields().find("value");
    double v = 0;
    if (value == samples[0].struct_value().fields().end() ||
        value->second.list_value().values_size() != 2 ||
        !absl::SimpleAtod(value->second.list_value().values(1).string_value(), &v)) {
      return absl::InternalError(absl::StrCat(promql, ": no value in the sample"));
    }
    return v;
  }

 private:
  PrometheusProcess(std::unique_ptr<TempDir> dir, std::string address)
      : dir_(std::move(dir)), address_(std::move(address)) {}

  absl::Status WaitUntilReady() {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      if (!child_->Running()) {
        return absl::UnavailableError(
            absl::StrCat("prometheus exited before it was ready:\n", Log()));
      }
      absl::StatusOr<HttpResponse> ready = HttpGetResponse(address_, "/-/ready", absl::Seconds(5));
      if (ready.ok() && ready->status == 200) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError(absl::StrCat("prometheus at ", address_, " not ready after ",
                                                    absl::FormatDuration(kTimeout), ":\n", Log()));
  }

  const std::unique_ptr<TempDir> dir_;
  const std::string address_;
  std::unique_ptr<ChildProcess> child_;
};

// How many alerts deploy/prometheus/alerts.yml defines ("- alert:" lines).
int AlertsInRuleFile() {
  std::ifstream in(absl::StrCat(JOBBROKER_SOURCE_DIR, "/deploy/prometheus/alerts.yml"));
  int alerts = 0;
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "- alert:")) ++alerts;
  }
  return alerts;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(PrometheusBinary().c_str(), X_OK) != 0) {
      GTEST_SKIP() << PrometheusBinary()
                   << " not found: install Debian's `prometheus` package "
                      "(scripts/install-deps.sh does) or set $PROMETHEUS_BINARY";
    }
    auto broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    client_ = std::make_unique<BrokerClient>(broker_->NewChannel());
    auto prometheus = PrometheusProcess::Start(broker_->http_address());
    ASSERT_TRUE(prometheus.ok()) << prometheus.status();
    prometheus_ = *std::move(prometheus);
    // One deadline for all of a test's waits: with the metrics missing, each wait would
    // otherwise take the whole timeout and the test would outlast ctest's.
    deadline_ = absl::Now() + kTimeout;
  }

  // Polls `promql` until its value is `want` or the test's deadline passes (then it asks once).
  // The failure message shows the last answer, the broker's own /metrics and Prometheus' log.
  void ExpectEventually(const std::string& promql, double want) {
    absl::StatusOr<std::optional<double>> got;
    while (true) {
      got = prometheus_->QueryValue(promql);
      if (got.ok() && got->has_value() && **got == want) return;
      if (absl::Now() >= deadline_) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    std::string last = !got.ok()          ? got.status().ToString()
                       : got->has_value() ? absl::StrCat(**got)
                                          : std::string("no series");
    ADD_FAILURE() << promql << " is " << last << " at the test's deadline ("
                  << absl::FormatDuration(kTimeout) << " after Prometheus was ready), want " << want
                  << "\n--- the broker's /metrics ---\n"
                  << HttpGet(broker_->http_address(), "/metrics") << "\n--- prometheus log ---\n"
                  << prometheus_->Log();
  }

  // Enqueues `n` jobs on `queue`; returns their ids.
  std::vector<std::string> EnqueueMany(const std::string& queue, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(client_->MustEnqueue(queue, absl::StrCat("job", i)));
    return ids;
  }

  void FailPermanently(const v1::LeasedJob& job) {
    v1::FailRequest fail;
    fail.set_job_id(job.job_id());
    fail.set_lease_id(job.lease_id());
    fail.set_error("not an address");
    fail.set_permanent(true);
    v1::FailResponse resp;
    EXPECT_THAT(client_->Fail(fail, &resp), IsOk());
    EXPECT_EQ(resp.state(), v1::JOB_STATE_FAILED);
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::unique_ptr<BrokerClient> client_;
  std::unique_ptr<PrometheusProcess> prometheus_;
  absl::Time deadline_;
};

TEST_F(PrometheusTest, ScrapesTheBroker) {
  ExpectEventually("up{job=\"jobbroker\"}", 1);
  // Prometheus checks what it scraped: a sample it could not parse fails the whole scrape
  // (up = 0), and these are the process metrics every dashboard expects.
  ExpectEventually("count(process_start_time_seconds{job=\"jobbroker\"})", 1);
  ExpectEventually("count(process_resident_memory_bytes{job=\"jobbroker\"} > 0)", 1);
}

TEST_F(PrometheusTest, CountsTheWorkload) {
  // 100 jobs: a worker acks 97 and fails 3 for good.
  EnqueueMany("emails", 100);
  std::vector<v1::LeasedJob> jobs = client_->MustLease("emails", "worker-1", 100);
  ASSERT_EQ(jobs.size(), 100u);
  for (int i = 0; i < 97; ++i) client_->MustAck(jobs[i]);
  for (int i = 97; i < 100; ++i) FailPermanently(jobs[i]);

  ExpectEventually("sum(jobbroker_enqueued_total)", 100);
  ExpectEventually("sum(jobbroker_leased_total{queue=\"emails\"})", 100);
  ExpectEventually("sum(jobbroker_attempts_total{outcome=\"completed\"})", 97);
  ExpectEventually("sum(jobbroker_attempts_total{outcome=\"permanent_error\"})", 3);
  ExpectEventually("sum(jobbroker_dead_total{reason=\"permanent\"})", 3);
  ExpectEventually("sum(jobbroker_jobs{queue=\"emails\",state=\"completed\"})", 97);
  ExpectEventually("sum(jobbroker_jobs{queue=\"emails\",state=\"failed\"})", 3);
  ExpectEventually("sum(jobbroker_schedule_to_start_seconds_count{queue=\"emails\"})", 100);
  ExpectEventually("sum(jobbroker_run_seconds_count{queue=\"emails\"})", 100);
  // Every Enqueue went through the RPC histogram, with its full method name and code.
  ExpectEventually(
      "sum(jobbroker_rpc_duration_seconds_count{method=\"/jobbroker.v1.Broker/Enqueue\","
      "code=\"OK\"})",
      100);
}

// The rules of deploy/prometheus/alerts.yml, on the names the broker really exports: every rule
// evaluates without error, and jobs dying fire JobbrokerDeadJobs for their queue.
TEST_F(PrometheusTest, AlertRulesEvaluateAndDeadJobsFire) {
  EnqueueMany("reports", 3);
  std::vector<v1::LeasedJob> jobs = client_->MustLease("reports", "worker-1", 3);
  ASSERT_EQ(jobs.size(), 3u);
  // One death first, seen by Prometheus, then two more: a rise that increase() sees whether or
  // not the broker exports the counter at 0 before the first death.
  FailPermanently(jobs[0]);
  ExpectEventually("sum(jobbroker_dead_total{queue=\"reports\"})", 1);
  FailPermanently(jobs[1]);
  FailPermanently(jobs[2]);
  ExpectEventually("sum(jobbroker_dead_total{queue=\"reports\"})", 3);
  ExpectEventually(
      "count(ALERTS{alertname=\"JobbrokerDeadJobs\",alertstate=\"firing\",queue=\"reports\"})", 1);
  // The broker is up: its down alert stays quiet.
  ExpectEventually("count(ALERTS{alertname=\"JobbrokerDown\"}) or vector(0)", 0);

  // Every rule was loaded and its last evaluation had no error (a typo in a function name or a
  // many-to-many match on the real labels shows up here, not in promtool's syntax check).
  absl::StatusOr<Value> rules = prometheus_->Api("/api/v1/rules");
  ASSERT_TRUE(rules.ok()) << rules.status();
  int loaded = 0;
  std::vector<std::string> unhealthy;
  for (const Value& group : rules->struct_value().fields().at("groups").list_value().values()) {
    for (const Value& rule : group.struct_value().fields().at("rules").list_value().values()) {
      const auto& fields = rule.struct_value().fields();
      ++loaded;
      if (fields.at("health").string_value() != "ok") {
        auto error = fields.find("lastError");
        unhealthy.push_back(
            absl::StrCat(fields.at("name").string_value(), ": ", fields.at("health").string_value(),
                         " ", error == fields.end() ? "" : error->second.string_value()));
      }
    }
  }
  EXPECT_EQ(loaded, AlertsInRuleFile());
  EXPECT_TRUE(unhealthy.empty()) << absl::StrJoin(unhealthy, "\n");
}

}  // namespace
}  // namespace jobbroker::testing
