#include "tests/cluster/jepsen/etcd_cluster.h"

#include <filesystem>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/http_client.h"

namespace jobbroker::jepsen {
namespace {

std::string Url(int port) { return absl::StrCat("http://127.0.0.1:", port); }

// The first `"key":"<digits>"` of a JSON text (etcd's gateway prints uint64 fields as strings).
std::string Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + key + "\":\"?([0-9]+)"))) return m[1];
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(const std::string& dir,
                                                                std::vector<int> client_ports,
                                                                std::vector<int> peer_ports) {
  auto cluster = std::unique_ptr<EtcdCluster>(new EtcdCluster());
  std::vector<std::string> initial;
  for (size_t k = 0; k < client_ports.size(); ++k) {
    Member m;
    m.name = absl::StrCat("etcd-", k);
    m.data_dir = absl::StrCat(dir, "/", m.name);
    m.log_path = absl::StrCat(dir, "/", m.name, ".log");
    m.client_port = client_ports[k];
    m.peer_port = peer_ports[k];
    initial.push_back(absl::StrCat(m.name, "=", Url(m.peer_port)));
    cluster->members_.push_back(std::move(m));
  }
  cluster->initial_cluster_ = absl::StrJoin(initial, ",");
  for (int k = 0; k < cluster->size(); ++k) {
    if (absl::Status s = cluster->Launch(k, true); !s.ok()) return s;
  }
  for (int k = 0; k < cluster->size(); ++k) {
    if (absl::Status s = cluster->AwaitHealthy(k, absl::Seconds(60)); !s.ok()) return s;
  }
  return cluster;
}

std::string EtcdCluster::client_address(int k) const {
  return absl::StrCat("127.0.0.1:", members_[k].client_port);
}

absl::Status EtcdCluster::Launch(int k, bool initial) {
  Member& m = members_[k];
  std::error_code ec;
  std::filesystem::create_directories(m.data_dir, ec);
  std::vector<std::string> argv = {
      testing::kEtcdBinary,
      "--name=" + m.name,
      "--data-dir=" + m.data_dir,
      "--listen-client-urls=" + Url(m.client_port),
      "--advertise-client-urls=" + Url(m.client_port),
      "--listen-peer-urls=" + Url(m.peer_port),
      "--initial-advertise-peer-urls=" + Url(m.peer_port),
      "--initial-cluster=" + initial_cluster_,
      std::string("--initial-cluster-state=") + (initial ? "new" : "existing"),
      "--initial-cluster-token=jepsen",
      "--logger=zap",
      "--log-level=warn",
  };
  auto process = testing::ChildProcess::Start(std::move(argv), m.log_path);
  if (!process.ok()) return process.status();
  m.process = *std::move(process);
  return absl::OkStatus();
}

absl::Status EtcdCluster::AwaitHealthy(int k, absl::Duration timeout) {
  Member& m = members_[k];
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (!m.process->Running()) {
      return absl::UnavailableError(
          absl::StrCat(m.name, " exited with code ", m.process->exit_code(), "; see ", m.log_path));
    }
    auto health = testing::HttpGetResponse(client_address(k), "/health", absl::Seconds(1));
    if (health.ok() && health->status == 200 && health->body.find("true") != std::string::npos)
      return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat(m.name, " not healthy within ",
                                             absl::FormatDuration(timeout), "; see ", m.log_path));
}

absl::StatusOr<int> EtcdCluster::Leader() const {
  for (int k = 0; k < size(); ++k) {
    if (!Running(k)) continue;
    auto status = testing::HttpSend(client_address(k), "POST", "/v3/maintenance/status",
                                    {"Content-Type: application/json"}, "{}", absl::Seconds(1));
    if (!status.ok() || status->status != 200) continue;
    const std::string leader = Field(status->body, "leader");
    const std::string self = Field(status->body, "member_id");
    if (leader.empty() || leader == "0") continue;
    if (leader == self) return k;
  }
  return absl::UnavailableError("no etcd member says it leads");
}

void EtcdCluster::Kill9(int k) {
  if (members_[k].process == nullptr) return;
  members_[k].process->Kill9();
  members_[k].process.reset();
}

absl::Status EtcdCluster::Restart(int k) {
  Kill9(k);
  if (absl::Status s = Launch(k, false); !s.ok()) return s;
  return AwaitHealthy(k, absl::Seconds(60));
}

void EtcdCluster::Stop() {
  for (Member& m : members_) {
    if (m.process != nullptr) (void)m.process->Stop(absl::Seconds(10));
    m.process.reset();
  }
}

}  // namespace jobbroker::jepsen
