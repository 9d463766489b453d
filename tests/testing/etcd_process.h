#pragma once

#include <functional>
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

// TLS for an EtcdProcess (PEM files): its client URL is then https://. `ca_file` set: etcd
// requires client certificates signed by it (--client-cert-auth); `client_cert_file` and
// `client_key_file` are the ones Start's readiness check presents.
struct EtcdTls {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

// A real one-member etcd for a test: `/usr/bin/etcd` on free loopback ports for its client and
// peer URLs, with its data in `data_dir`, started by Start() and stopped by PID (the destructor,
// or Kill9). Restart() starts it again on the same ports and data, as after a crash. Election and
// heartbeat timeouts are short (tests have one member) so that it is up in well under a second.
// Not thread-safe.
class EtcdProcess {
 public:
  // kFailedPrecondition, saying what to install, if /usr/bin/etcd is missing; kUnavailable, with
  // etcd's log, if it did not answer within `timeout`. A port taken by another process before
  // etcd bound it is not an error: it is tried again on other ports (up to 5 times), in a fresh
  // `data_dir`.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::string data_dir, EtcdTls tls = {}, absl::Duration timeout = absl::Seconds(30));
  // Start, with the ports picked by `pick_port` (FreeLoopbackPort: the client's, then the
  // peer's, for each try); a test of the retry picks a taken one.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> StartPicking(
      std::string data_dir, EtcdTls tls, absl::Duration timeout,
      const std::function<absl::StatusOr<int>()>& pick_port);
  ~EtcdProcess();

  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "http://127.0.0.1:<port>" ("https://" with TLS).
  const std::string& client_url() const { return client_url_; }
  // SIGKILL, then reaps it.
  void Kill9();
  // SIGSTOP (it keeps its connections and answers nothing), and SIGCONT.
  absl::Status Pause();
  absl::Status Continue();
  // Kill9 if it runs, then starts it again on the same ports and data dir and waits until it
  // answers.
  absl::Status Restart(absl::Duration timeout = absl::Seconds(30));
  std::string ReadLog() const;

 private:
  EtcdProcess(std::string data_dir, EtcdTls tls, int client_port, int peer_port);
  absl::Status Launch(absl::Duration timeout);

  const std::string data_dir_;
  const EtcdTls tls_;
  const int client_port_;
  const int peer_port_;
  const std::string client_url_;
  const std::string log_path_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace jobbroker::testing
