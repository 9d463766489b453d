#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker::testing {

// Path of the jobbroker binary under test: $JOBBROKER_BINARY if set, else the one this build
// produced (compile definition JOBBROKER_BINARY).
std::string BrokerBinaryPath();

// A fresh directory under $TEST_TMPDIR (else /tmp), removed with everything in it when the
// object dies, unless $JOBBROKER_KEEP_TEST_DIRS is set (to look at a failed run's files).
class TempDir {
 public:
  // Fails only if the directory cannot be created.
  static absl::StatusOr<std::unique_ptr<TempDir>> Create();
  ~TempDir();

  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `contents` to `name` inside the directory; returns the file's full path.
  absl::StatusOr<std::string> WriteFile(absl::string_view name, absl::string_view contents) const;

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}

  const std::string path_;
};

// Writes a --config file (proto3 JSON of jobbroker.v1.ServerConfig) into `dir` under a unique
// name and returns its path. The JSON is not checked here: tests also write bad configs.
absl::StatusOr<std::string> WriteConfig(const TempDir& dir, absl::string_view json);

struct BrokerProcessOptions {
  // JSON text for --config; empty means no --config flag. Written to the process's temp dir.
  std::string config_json;
  // Data directory to use; empty means a fresh one inside the process's temp dir. Give one to
  // start a second broker object on another's data (Restart() covers the common case).
  std::string data_dir;
  // Appended to the command line as is.
  std::vector<std::string> extra_args;
  // NAME=VALUE settings added to the child's environment (through env(1)), e.g. an LD_PRELOAD
  // fault shim.
  std::vector<std::string> environment;
  // How long to wait for the "serving" line before giving up.
  absl::Duration startup_timeout = absl::Seconds(30);
};

// Runs the real jobbroker binary as a child process on free ports (port 0; never a fixed port).
//
// The child's stdout is read until its "jobbroker: serving grpc=... http=..." line, and drained
// afterwards so the child never blocks on a full pipe. Its stderr goes to a file in the temp dir
// (one file per launch) so that a failure can show it. The destructor SIGKILLs a child that is
// still running. The child also gets SIGKILL if the thread that started it exits
// (PR_SET_PDEATHSIG), so a crashed test leaves no broker behind: start brokers from the test's
// main thread.
//
// Not thread-safe: one test thread drives it; the accessors may be read from other threads
// while no Start/Restart/Kill9/Terminate runs.
class BrokerProcess {
 public:
  // Starts the broker and waits until it serves. On a startup timeout or an early exit, returns
  // an error whose message holds the child's stderr (and stdout) so far.
  static absl::StatusOr<std::unique_ptr<BrokerProcess>> Start(BrokerProcessOptions options = {});

  ~BrokerProcess();

  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  // "127.0.0.1:PORT" of the gRPC listener of the current launch. A restart changes the port, so
  // take new channels after Restart().
  const std::string& address() const { return address_; }
  const std::string& http_address() const { return http_address_; }
  const std::string& data_dir() const { return data_dir_; }
  // The temp dir that holds logs, the config file and (by default) the data dir.
  const TempDir& temp_dir() const { return *temp_dir_; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // SIGKILL and reap: the broker gets no chance to flush anything.
  void Kill9();

  // SIGTERM, then waits up to `timeout` for the exit. Returns the exit code, or 128 + signal
  // number if a signal ended it. On timeout the child is SIGKILLed and an error returned.
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(30));

  // Waits up to `timeout` for the broker to exit by itself (no signal sent) and returns its exit
  // code, or 128 + signal number. On timeout it is left running and an error returned.
  absl::StatusOr<int> AwaitExit(absl::Duration timeout);

  // Starts the binary again on the same data dir and config. A child still running is first
  // stopped with Terminate(). Same failure reporting as Start().
  absl::Status Restart();

  // What the current (or last) launch wrote to stderr so far.
  std::string ReadStderr() const;
  // What the current (or last) launch wrote to stdout so far.
  std::string ReadStdout() const;

  // A new channel to address(), allowing messages up to 64 MiB each way (the server accepts
  // as much, so oversized payloads reach its validation).
  std::shared_ptr<grpc::Channel> NewChannel() const;
  std::unique_ptr<jobbroker::v1::Broker::Stub> NewBrokerStub() const;
  std::unique_ptr<jobbroker::v1::Admin::Stub> NewAdminStub() const;

 private:
  BrokerProcess(BrokerProcessOptions options, std::unique_ptr<TempDir> temp_dir,
                std::string config_path, std::string data_dir);

  // Forks and execs the binary, then waits for the serving line.
  absl::Status Launch();
  // Waits up to `timeout` for the child to exit and reaps it; returns its raw wait status.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);
  // Joins the stdout reader after the child is gone.
  void JoinReader();
  void ReadStdoutUntilEof(int fd);
  // Describes the current launch's output, for error messages.
  std::string DescribeOutput() const;

  const BrokerProcessOptions options_;
  const std::unique_ptr<TempDir> temp_dir_;
  const std::string config_path_;
  const std::string data_dir_;

  pid_t pid_ = -1;
  int launches_ = 0;
  std::string stderr_path_;
  std::string address_;
  std::string http_address_;
  std::thread stdout_reader_;

  mutable absl::Mutex mu_;
  std::string stdout_text_ ABSL_GUARDED_BY(mu_);
  bool stdout_eof_ ABSL_GUARDED_BY(mu_) = false;
};

// How a run of the binary that was expected to end on its own ended.
struct ExitResult {
  // Exit code, or 128 + signal number if a signal ended it.
  int exit_code = 0;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs the binary with `args` (no implicit flags) in `dir`'s files and waits for it to exit on
// its own, e.g. on a bad config. If it is still running after `timeout` it is killed and an
// error returned.
absl::StatusOr<ExitResult> RunBrokerToExit(const TempDir& dir, const std::vector<std::string>& args,
                                           absl::Duration timeout = absl::Seconds(30));

// A channel to `address` allowing messages up to 64 MiB each way.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address);

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server). On OK, sets
// `*serving_status` to the HealthCheckResponse.ServingStatus value (1 = SERVING). A deadline on
// top of the client library's client::CheckHealth.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         int* serving_status, absl::Duration timeout = absl::Seconds(10));

}  // namespace jobbroker::testing
