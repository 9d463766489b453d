#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/child_process.h"

namespace jobbroker::testing {

// Where tests find etcd: Debian's etcd-server (scripts/install-deps.sh).
inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// A loopback TCP port that was free a moment ago (bound to port 0, then closed), for a program
// that cannot be told to listen on port 0, such as etcd.
absl::StatusOr<int> FreeLoopbackPort();

// A real one-member etcd for a test: `/usr/bin/etcd` on free loopback ports for its client and
// peer URLs, with its data in `data_dir`, started by Start() and stopped by PID (the destructor,
// or Kill9). Restart() starts it again on the same ports and data, as after a crash. Election and
// heartbeat timeouts are short (tests have one member) so that it is up in well under a second.
// Not thread-safe.
class EtcdProcess {
 public:
  // kFailedPrecondition, saying what to install, if /usr/bin/etcd is missing; kUnavailable, with
  // etcd's log, if it did not answer within `timeout`.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::string data_dir, absl::Duration timeout = absl::Seconds(30));
  ~EtcdProcess();

  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "http://127.0.0.1:<port>".
  const std::string& client_url() const { return client_url_; }
  // SIGKILL, then reaps it.
  void Kill9();
  // Kill9 if it runs, then starts it again on the same ports and data dir and waits until it
  // answers.
  absl::Status Restart(absl::Duration timeout = absl::Seconds(30));
  std::string ReadLog() const;

 private:
  EtcdProcess(std::string data_dir, int client_port, int peer_port);
  absl::Status Launch(absl::Duration timeout);

  const std::string data_dir_;
  const int client_port_;
  const int peer_port_;
  const std::string client_url_;
  const std::string log_path_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace jobbroker::testing
