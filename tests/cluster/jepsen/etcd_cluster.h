#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/child_process.h"

namespace jobbroker::jepsen {

// A real etcd cluster of `members` members (Debian's /usr/bin/etcd) on loopback ports chosen
// by the caller, each with its data dir under `dir`, for the cluster harness: one member can be
// SIGKILLed and restarted on the same ports and data while the others keep a quorum.
class EtcdCluster {
 public:
  // Starts every member and waits until each answers /health (the cluster has a leader).
  // `client_ports` and `peer_ports` hold one port per member.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const std::string& dir,
                                                            std::vector<int> client_ports,
                                                            std::vector<int> peer_ports);

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:<client port>" of member `k`.
  std::string client_address(int k) const;
  // The member that leads the cluster now (asked over each member's HTTP gateway).
  absl::StatusOr<int> Leader() const;
  bool Running(int k) const { return members_[k].process != nullptr; }
  void Kill9(int k);
  // Starts a killed member again on its ports and data dir and waits until it answers /health.
  absl::Status Restart(int k);
  // SIGTERM every member.
  void Stop();

 private:
  struct Member {
    std::string name;
    std::string data_dir;
    std::string log_path;
    int client_port = 0;
    int peer_port = 0;
    std::unique_ptr<testing::ChildProcess> process;
  };

  absl::Status Launch(int k, bool initial);
  absl::Status AwaitHealthy(int k, absl::Duration timeout);

  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace jobbroker::jepsen
