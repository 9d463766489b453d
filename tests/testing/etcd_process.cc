#include "tests/testing/etcd_process.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/etcd/grpc_etcd.h"
#include "tests/testing/process_util.h"

namespace jobbroker::testing {

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status status = ErrnoError("bind 127.0.0.1:0");
    close(fd);
    return status;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

EtcdProcess::EtcdProcess(std::string data_dir, EtcdTls tls, int client_port, int peer_port)
    : data_dir_(std::move(data_dir)),
      tls_(std::move(tls)),
      client_port_(client_port),
      peer_port_(peer_port),
      client_url_(
          absl::StrCat(tls_.cert_file.empty() ? "http" : "https", "://127.0.0.1:", client_port)),
      log_path_(data_dir_ + ".log") {}

EtcdProcess::~EtcdProcess() { Kill9(); }

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(std::string data_dir, EtcdTls tls,
                                                                absl::Duration timeout) {
  return StartPicking(std::move(data_dir), std::move(tls), timeout, FreeLoopbackPort);
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::StartPicking(
    std::string data_dir, EtcdTls tls, absl::Duration timeout,
    const std::function<absl::StatusOr<int>()>& pick_port) {
  if (access(kEtcdBinary, X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(kEtcdBinary,
                                                      " is missing: install Debian's etcd-server "
                                                      "(scripts/install-deps.sh)"));
  }
  // etcd cannot listen on port 0 and say which port it got, so the ports are picked free here
  // and bound by etcd a moment later; a test running alongside (or a connection's local port)
  // can take one in between. etcd then exits at once saying so, and a fresh pair is tried.
  constexpr int kAttempts = 5;
  absl::Status launched;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    absl::StatusOr<int> client_port = pick_port();
    if (!client_port.ok()) return client_port.status();
    absl::StatusOr<int> peer_port = pick_port();
    if (!peer_port.ok()) return peer_port.status();
    auto etcd =
        std::unique_ptr<EtcdProcess>(new EtcdProcess(data_dir, tls, *client_port, *peer_port));
    launched = etcd->Launch(timeout);
    if (launched.ok()) return etcd;
    if (!absl::StrContains(launched.message(), "address already in use")) return launched;
    etcd->Kill9();
    // It exits before it writes its data dir, but a member half made would not start again
    // with other peer URLs. Its log goes too: the log is appended to, and this try's bind error
    // must not be read as the next try's.
    std::error_code ignored;
    std::filesystem::remove_all(data_dir, ignored);
    std::filesystem::remove(data_dir + ".log", ignored);
  }
  return launched;
}

void EtcdProcess::Kill9() {
  if (process_ != nullptr) process_->Kill9();
  process_.reset();
}

absl::Status EtcdProcess::Pause() {
  if (process_ == nullptr) return absl::FailedPreconditionError("etcd is not running");
  return process_->Pause();
}

absl::Status EtcdProcess::Continue() {
  if (process_ == nullptr) return absl::FailedPreconditionError("etcd is not running");
  return process_->Continue();
}

absl::Status EtcdProcess::Restart(absl::Duration timeout) {
  Kill9();
  return Launch(timeout);
}

std::string EtcdProcess::ReadLog() const { return ReadWholeFile(log_path_); }

absl::Status EtcdProcess::Launch(absl::Duration timeout) {
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> argv = {
      kEtcdBinary,
      "--name=test",
      "--data-dir=" + data_dir_,
      "--listen-client-urls=" + client_url_,
      "--advertise-client-urls=" + client_url_,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=test=" + peer_url,
      "--initial-cluster-state=new",
      // One member: it elects itself after one election timeout.
      "--heartbeat-interval=10",
      "--election-timeout=100",
      "--logger=zap",
      "--log-level=warn",
  };
  if (!tls_.cert_file.empty()) {
    argv.push_back("--cert-file=" + tls_.cert_file);
    argv.push_back("--key-file=" + tls_.key_file);
  }
  if (!tls_.ca_file.empty()) {
    argv.push_back("--trusted-ca-file=" + tls_.ca_file);
    argv.push_back("--client-cert-auth");
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Start(std::move(argv), log_path_);
  if (!process.ok()) return process.status();
  process_ = *std::move(process);

  cluster::GrpcEtcdOptions options;
  options.endpoints = {client_url_};
  options.call_timeout = absl::Seconds(1);
  options.ca_file = tls_.ca_file;
  options.cert_file = tls_.client_cert_file;
  options.key_file = tls_.client_key_file;
  absl::StatusOr<std::unique_ptr<cluster::GrpcEtcd>> client =
      cluster::GrpcEtcd::Create(std::move(options));
  if (!client.ok()) return client.status();
  const absl::Time give_up = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < give_up) {
    if (!process_->Running()) {
      return absl::UnavailableError(
          absl::StrCat("etcd exited with code ", process_->exit_code(), "; its log:\n", ReadLog()));
    }
    last = (*client)->Get("health").status();
    if (last.ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::UnavailableError(absl::StrCat("etcd at ", client_url_, " did not answer within ",
                                             absl::FormatDuration(timeout), " (", last.ToString(),
                                             "); its log:\n", ReadLog()));
}

}  // namespace jobbroker::testing
