// promtool, Prometheus' own checker, on what an operator deploys: a real /metrics scrape after a
// workload that touches every kind of transition, and deploy/prometheus/alerts.yml (its syntax,
// its unit tests in alerts_test.yml, and its runbook links into docs/operations.md). Plus the
// rules promtool does not know: every family explains itself, and no label can grow with the
// number of jobs.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/child_process.h"
#include "tests/testing/cluster_node_options.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/http_client.h"

#ifndef JOBBROKER_SOURCE_DIR
#error "JOBBROKER_SOURCE_DIR must name the source tree (for deploy/ and docs/)"
#endif

namespace jobbroker::testing {
namespace {

const std::string kAlertsFile = absl::StrCat(JOBBROKER_SOURCE_DIR, "/deploy/prometheus/alerts.yml");
const std::string kAlertsTestFile =
    absl::StrCat(JOBBROKER_SOURCE_DIR, "/deploy/prometheus/alerts_test.yml");
const std::string kOperationsDoc = absl::StrCat(JOBBROKER_SOURCE_DIR, "/docs/operations.md");

// $PROMTOOL_BINARY, else Debian's.
std::string PromtoolBinary() {
  const char* env = std::getenv("PROMTOOL_BINARY");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/promtool";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One sample line of the text format: name{label="value",...} value [timestamp].
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string line;
};

// The text exposition format, as far as these checks need it.
struct Exposition {
  std::map<std::string, std::string> help;  // family -> HELP text
  std::map<std::string, std::string> type;  // family -> TYPE
  std::vector<Sample> samples;

  // The family a sample belongs to: its own name, or the histogram or summary it is a
  // _bucket/_sum/_count series of; "" if no TYPE line covers it.
  std::string FamilyOf(const std::string& sample_name) const {
    if (type.count(sample_name)) return sample_name;
    for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
      absl::string_view base = sample_name;
      if (!absl::ConsumeSuffix(&base, suffix)) continue;
      auto it = type.find(std::string(base));
      if (it != type.end() && (it->second == "histogram" || it->second == "summary")) {
        return it->first;
      }
    }
    return "";
  }
};

absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  Exposition out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# HELP ")) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
      out.help[kv.first] = kv.second;
      continue;
    }
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
      out.type[kv.first] = kv.second;
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    Sample sample;
    sample.line = std::string(line);
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("no value in: ", line));
    }
    sample.name = std::string(line.substr(0, name_end));
    if (line[name_end] == '{') {
      // label="value" pairs; values may hold escaped quotes, commas and braces.
      size_t i = name_end + 1;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == absl::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          return absl::InvalidArgumentError(absl::StrCat("bad labels in: ", line));
        }
        std::string label(absl::StripAsciiWhitespace(line.substr(i, eq - i)));
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          value.push_back(line[j]);
        }
        if (j >= line.size()) return absl::InvalidArgumentError(absl::StrCat("open quote: ", line));
        sample.labels[label] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return absl::InvalidArgumentError(absl::StrCat("open brace: ", line));
    }
    out.samples.push_back(std::move(sample));
  }
  return out;
}

// GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to dashes.
std::string HeadingAnchor(absl::string_view heading) {
  std::string anchor;
  for (const char c : absl::StripAsciiWhitespace(heading)) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
      anchor.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
    } else if (c == ' ') {
      anchor.push_back('-');
    }
  }
  return anchor;
}

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(PromtoolBinary().c_str(), X_OK) != 0) {
      GTEST_SKIP() << PromtoolBinary()
                   << " not found: install Debian's `prometheus` package "
                      "(scripts/install-deps.sh does) or set $PROMTOOL_BINARY";
    }
    auto dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *std::move(dir);
  }

  // Runs promtool with `args` and `input` on its stdin.
  CommandResult Promtool(std::vector<std::string> args, absl::string_view input = "") {
    args.insert(args.begin(), PromtoolBinary());
    absl::StatusOr<CommandResult> result = RunCommand(dir_->path(), args, input);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : CommandResult{-1, result.status().ToString()};
  }

  std::unique_ptr<TempDir> dir_;
};

// A broker that has seen a bit of everything: enqueues and a dedup, acks, a retried error, a
// permanent error, an expired lease, a release, a cancel, a delayed job, and ready jobs left.
class PromtoolMetricsTest : public PromtoolTest {
 protected:
  void SetUp() override {
    PromtoolTest::SetUp();
    if (IsSkipped()) return;
    auto broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    client_ = std::make_unique<BrokerClient>(broker_->NewChannel());
    RunWorkload();
    absl::StatusOr<HttpResponse> metrics = HttpGetResponse(broker_->http_address(), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ASSERT_EQ(metrics->status, 200) << metrics->body;
    metrics_ = metrics->body;
  }

  void RunWorkload() {
    for (int i = 0; i < 6; ++i) job_ids_.push_back(client_->MustEnqueue("emails", "x"));
    v1::EnqueueRequest dedup;
    dedup.set_queue("emails");
    dedup.set_payload("welcome");
    dedup.set_dedup_key("welcome-ada");
    job_ids_.push_back(client_->MustEnqueue(dedup));
    client_->MustEnqueue(dedup);  // deduplicated
    v1::EnqueueRequest delayed;
    delayed.set_queue("reports");
    *delayed.mutable_delay() = ToProto(absl::Hours(1));
    job_ids_.push_back(client_->MustEnqueue(delayed));

    std::vector<v1::LeasedJob> jobs = client_->MustLease("emails", "worker-1", 4);
    ASSERT_EQ(jobs.size(), 4u);
    client_->MustAck(jobs[0]);
    v1::FailRequest fail;
    v1::FailResponse failed;
    fail.set_job_id(jobs[1].job_id());
    fail.set_lease_id(jobs[1].lease_id());
    fail.set_error("smtp: 451 try again");
    ASSERT_THAT(client_->Fail(fail, &failed), IsOk());  // retried after a backoff
    fail.set_job_id(jobs[2].job_id());
    fail.set_lease_id(jobs[2].lease_id());
    fail.set_error("not an address");
    fail.set_permanent(true);
    ASSERT_THAT(client_->Fail(fail, &failed), IsOk());  // dead
    v1::ReleaseRequest release;
    release.set_job_id(jobs[3].job_id());
    release.set_lease_id(jobs[3].lease_id());
    ASSERT_THAT(client_->Release(release), IsOk());

    // A lease that runs out (the shortest allowed) becomes a LEASE_EXPIRED attempt.
    std::vector<v1::LeasedJob> expiring =
        client_->MustLease("emails", "worker-2", 1, absl::ZeroDuration(), absl::Milliseconds(100));
    ASSERT_EQ(expiring.size(), 1u);
    ASSERT_TRUE(PollUntil(
        [&] {
          v1::Job job = client_->MustGetJob(expiring[0].job_id());
          return job.attempts_size() > 0 && job.attempts(job.attempts_size() - 1).outcome() ==
                                                v1::ATTEMPT_OUTCOME_LEASE_EXPIRED;
        },
        absl::Seconds(30)))
        << "the 100 ms lease did not expire";

    v1::Job cancelled;
    ASSERT_THAT(client_->CancelJob(job_ids_.back(), &cancelled), IsOk());  // the delayed one
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::unique_ptr<BrokerClient> client_;
  std::vector<std::string> job_ids_;
  std::string metrics_;
};

TEST_F(PromtoolMetricsTest, MetricsPassPromtoolCheck) {
  // promtool exits 0 only when the text parses and no lint rule (counter names end in _total,
  // units in base units, HELP present, ...) complains.
  CommandResult result = Promtool({"check", "metrics"}, metrics_);
  EXPECT_EQ(result.exit_code, 0) << "promtool check metrics:\n"
                                 << result.output << "\n--- /metrics ---\n"
                                 << metrics_;
}

TEST_F(PromtoolMetricsTest, EveryFamilyHasHelpAndBoundedLabels) {
  absl::StatusOr<Exposition> exposition = ParseExposition(metrics_);
  ASSERT_TRUE(exposition.ok()) << exposition.status() << "\n" << metrics_;
  ASSERT_FALSE(exposition->samples.empty()) << metrics_;

  std::set<std::string> problems;
  for (const auto& [family, type] : exposition->type) {
    auto help = exposition->help.find(family);
    if (help == exposition->help.end() || absl::StripAsciiWhitespace(help->second).empty()) {
      problems.insert(absl::StrCat(family, ": no HELP text"));
    }
  }
  for (const Sample& sample : exposition->samples) {
    if (exposition->FamilyOf(sample.name).empty()) {
      problems.insert(absl::StrCat(sample.name, ": no TYPE line"));
    }
    if (!absl::StartsWith(sample.name, "jobbroker_")) continue;
    // A label per job, lease, worker or key makes a series per job: memory and scrape size
    // grow without bound, and Prometheus falls over long before the broker does.
    for (const auto& [label, value] : sample.labels) {
      if (label == "id" || absl::EndsWith(label, "_id") || absl::EndsWith(label, "_key") ||
          label == "job" || label == "lease" || label == "worker" || label == "payload") {
        problems.insert(absl::StrCat(sample.name, ": unbounded label ", label));
      }
    }
  }
  // Whatever the label's name: no job id may appear in /metrics at all.
  for (const std::string& id : job_ids_) {
    if (absl::StrContains(metrics_, id))
      problems.insert(absl::StrCat("job id ", id, " in /metrics"));
  }
  EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "\n") << "\n--- /metrics ---\n"
                                << metrics_;
}

// The jobbroker_* names alerts.yml uses that `metrics` does not export, among those for which
// `considered` is true. An alert on a name the broker does not export never fires, and nothing
// says so.
std::set<std::string> AlertNamesNotExported(const std::string& metrics,
                                            bool (*considered)(const std::string& name)) {
  absl::StatusOr<Exposition> exposition = ParseExposition(metrics);
  EXPECT_TRUE(exposition.ok()) << exposition.status();
  std::set<std::string> exported;
  if (exposition.ok()) {
    for (const Sample& sample : exposition->samples) exported.insert(sample.name);
  }
  const std::string alerts = ReadFile(kAlertsFile);
  EXPECT_FALSE(alerts.empty()) << kAlertsFile;
  const std::regex name("jobbroker_[a-z_]+");
  std::set<std::string> missing;
  for (auto it = std::sregex_iterator(alerts.begin(), alerts.end(), name);
       it != std::sregex_iterator(); ++it) {
    if (considered(it->str()) && !exported.count(it->str())) missing.insert(it->str());
  }
  return missing;
}

bool IsClusterMetric(const std::string& name) {
  return absl::StartsWith(name, "jobbroker_cluster_");
}

TEST_F(PromtoolMetricsTest, EveryMetricTheAlertsUseIsExported) {
  // The cluster group's names: PromtoolClusterMetricsTest, on a cluster node.
  const std::set<std::string> missing = AlertNamesNotExported(
      metrics_, [](const std::string& name) { return !IsClusterMetric(name); });
  EXPECT_TRUE(missing.empty()) << "used in alerts.yml, not in /metrics: "
                               << absl::StrJoin(missing, ", ") << "\n--- /metrics ---\n"
                               << metrics_;
}

// A node of a real three-node cluster (etcd and three jobbroker processes) after a replicated
// write: cluster mode adds the jobbroker_cluster_* families, which must pass the same checks.
class PromtoolClusterMetricsTest : public PromtoolTest {
 protected:
  void SetUp() override {
    PromtoolTest::SetUp();
    if (IsSkipped()) return;
    absl::StatusOr<TestCluster> cluster = StartTestCluster(3, 1);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    // Any node forwards to the leader; the first tries may come before the election.
    BrokerClient client(cluster_.nodes[0]->NewChannel());
    ASSERT_TRUE(PollUntil(
        [&] {
          v1::EnqueueRequest request;
          request.set_queue("emails");
          request.set_payload("x");
          v1::EnqueueResponse response;
          return client.Enqueue(request, &response).ok();
        },
        absl::Seconds(60)))
        << "no write acknowledged";
    // The leader's scrape, once it has counted the commit wait and sees both followers.
    ASSERT_TRUE(PollUntil(
        [&] {
          for (const auto& node : cluster_.nodes) {
            absl::StatusOr<HttpResponse> got = HttpGetResponse(node->http_address(), "/metrics");
            if (!got.ok() || got->status != 200) continue;
            auto sample = [&got](const std::string& series) {
              return ::jobbroker::testing::Sample(got->body, series);
            };
            if (sample("jobbroker_cluster_partition_leader{partition=\"0\"}") == 1 &&
                sample("jobbroker_cluster_partition_in_sync_replicas{partition=\"0\"}") == 3 &&
                sample("jobbroker_cluster_commit_wait_seconds_count") >= 1) {
              metrics_ = got->body;
              return true;
            }
          }
          return false;
        },
        absl::Seconds(60)))
        << "no node reported leading partition 0 with three replicas in sync";
  }

  TestCluster cluster_;
  std::string metrics_;
};

TEST_F(PromtoolClusterMetricsTest, ClusterMetricsPassPromtoolCheck) {
  CommandResult result = Promtool({"check", "metrics"}, metrics_);
  EXPECT_EQ(result.exit_code, 0) << "promtool check metrics:\n"
                                 << result.output << "\n--- /metrics ---\n"
                                 << metrics_;
  EXPECT_THAT(metrics_, ::testing::HasSubstr(
                            "jobbroker_cluster_replica_lag_entries{partition=\"0\",follower="));
}

TEST_F(PromtoolClusterMetricsTest, EveryClusterMetricTheAlertsUseIsExported) {
  const std::set<std::string> missing = AlertNamesNotExported(metrics_, IsClusterMetric);
  EXPECT_TRUE(missing.empty()) << "used in alerts.yml, not in a cluster node's /metrics: "
                               << absl::StrJoin(missing, ", ") << "\n--- /metrics ---\n"
                               << metrics_;
}

TEST_F(PromtoolTest, AlertRulesAreValid) {
  CommandResult result = Promtool({"check", "rules", kAlertsFile});
  EXPECT_EQ(result.exit_code, 0) << "promtool check rules:\n" << result.output;
}

TEST_F(PromtoolTest, AlertRulesPassTheirUnitTests) {
  // alerts_test.yml feeds each alert series that must fire it and series that must not.
  CommandResult result = Promtool({"test", "rules", kAlertsTestFile});
  EXPECT_EQ(result.exit_code, 0) << "promtool test rules:\n" << result.output;
}

TEST(AlertRunbookTest, EveryRunbookIsASectionOfTheOperationsGuide) {
  const std::string alerts = ReadFile(kAlertsFile);
  const std::string doc = ReadFile(kOperationsDoc);
  ASSERT_FALSE(alerts.empty()) << kAlertsFile;
  ASSERT_FALSE(doc.empty()) << kOperationsDoc;
  std::set<std::string> anchors;
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    if (!absl::StartsWith(line, "#")) continue;
    anchors.insert(HeadingAnchor(line.substr(line.find_first_not_of('#'))));
  }
  int alert_count = 0;
  int runbook_count = 0;
  std::vector<std::string> broken;
  for (absl::string_view line : absl::StrSplit(alerts, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(line, "- alert:")) ++alert_count;
    if (!absl::ConsumePrefix(&line, "runbook:")) continue;
    ++runbook_count;
    absl::string_view link = absl::StripAsciiWhitespace(line);
    absl::ConsumePrefix(&link, "\"");
    absl::ConsumeSuffix(&link, "\"");
    if (!absl::ConsumePrefix(&link, "docs/operations.md#") || !anchors.count(std::string(link))) {
      broken.push_back(std::string(absl::StripAsciiWhitespace(line)));
    }
  }
  EXPECT_GT(alert_count, 0);
  EXPECT_EQ(runbook_count, alert_count) << "every alert needs annotations.runbook";
  EXPECT_TRUE(broken.empty()) << "runbooks that are not a heading of docs/operations.md:\n"
                              << absl::StrJoin(broken, "\n");
}

}  // namespace
}  // namespace jobbroker::testing
