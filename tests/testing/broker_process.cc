#include "tests/testing/broker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "jobbroker/health.h"

#ifndef JOBBROKER_BINARY
#error "JOBBROKER_BINARY must name the jobbroker binary under test"
#endif

#include "tests/testing/process_util.h"

namespace jobbroker::testing {
namespace {

constexpr char kServingPrefix[] = "jobbroker: serving ";
constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace

std::string BrokerBinaryPath() {
  if (const char* env = std::getenv("JOBBROKER_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return JOBBROKER_BINARY;
}

absl::StatusOr<std::unique_ptr<TempDir>> TempDir::Create() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl =
      absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp", "/jobbroker-test-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError(absl::StrCat("mkdtemp ", tmpl));
  return std::unique_ptr<TempDir>(new TempDir(std::move(tmpl)));
}

TempDir::~TempDir() {
  if (std::getenv("JOBBROKER_KEEP_TEST_DIRS") != nullptr) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::string> TempDir::WriteFile(absl::string_view name,
                                               absl::string_view contents) const {
  std::string path = absl::StrCat(path_, "/", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return path;
}

absl::StatusOr<std::string> WriteConfig(const TempDir& dir, absl::string_view json) {
  static std::atomic<int> counter{0};
  return dir.WriteFile(absl::StrCat("config-", counter.fetch_add(1), ".json"), json);
}

absl::StatusOr<std::unique_ptr<BrokerProcess>> BrokerProcess::Start(BrokerProcessOptions options) {
  absl::StatusOr<std::unique_ptr<TempDir>> temp_dir = TempDir::Create();
  if (!temp_dir.ok()) return temp_dir.status();
  std::string config_path;
  if (!options.config_json.empty()) {
    absl::StatusOr<std::string> path = WriteConfig(**temp_dir, options.config_json);
    if (!path.ok()) return path.status();
    config_path = *std::move(path);
  }
  std::string data_dir = options.data_dir;
  if (data_dir.empty()) {
    data_dir = absl::StrCat((*temp_dir)->path(), "/data");
    std::error_code ec;
    std::filesystem::create_directories(data_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", data_dir, ": ", ec.message()));
  }
  std::unique_ptr<BrokerProcess> process(new BrokerProcess(
      std::move(options), *std::move(temp_dir), std::move(config_path), std::move(data_dir)));
  if (absl::Status s = process->Launch(); !s.ok()) return s;
  return process;
}

BrokerProcess::BrokerProcess(BrokerProcessOptions options, std::unique_ptr<TempDir> temp_dir,
                             std::string config_path, std::string data_dir)
    : options_(std::move(options)),
      temp_dir_(std::move(temp_dir)),
      config_path_(std::move(config_path)),
      data_dir_(std::move(data_dir)) {}

BrokerProcess::~BrokerProcess() {
  if (pid_ > 0) KillAndReap(pid_);
  pid_ = -1;
  JoinReader();
}

absl::Status BrokerProcess::Launch() {
  ++launches_;
  stderr_path_ = absl::StrCat(temp_dir_->path(), "/stderr.", launches_, ".log");
  address_.clear();
  http_address_.clear();
  {
    absl::MutexLock lock(&mu_);
    stdout_text_.clear();
    stdout_eof_ = false;
  }

  std::vector<std::string> argv;
  if (!options_.environment.empty()) {
    argv.push_back("/usr/bin/env");
    argv.insert(argv.end(), options_.environment.begin(), options_.environment.end());
  }
  for (const std::string& a : {BrokerBinaryPath(), std::string("--listen"),
                               std::string("127.0.0.1:0"), std::string("--http-listen"),
                               std::string("127.0.0.1:0"), std::string("--data-dir"), data_dir_})
    argv.push_back(a);
  if (!config_path_.empty()) {
    argv.push_back("--config");
    argv.push_back(config_path_);
  }
  for (const std::string& a : options_.extra_args) argv.push_back(a);
  // tests/e2e/CMakeLists.txt runs some suites again with several partitions.
  if (const char* partitions = std::getenv("JOBBROKER_TEST_PARTITIONS")) {
    argv.push_back("--partitions");
    argv.push_back(partitions);
  }

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  absl::StatusOr<pid_t> pid = SpawnChild(
      std::move(argv), {.stdout_fd = fds[1], .stderr_path = stderr_path_, .truncate = true});
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    return pid.status();
  }
  pid_ = *pid;
  stdout_reader_ = std::thread([this, fd = fds[0]] { ReadStdoutUntilEof(fd); });

  // Wait for a whole serving line, or for stdout to close (the child exited or is about to).
  auto line_or_eof = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stdout_eof_) return true;
    const size_t start = stdout_text_.find(kServingPrefix);
    return start != std::string::npos && stdout_text_.find('\n', start) != std::string::npos;
  };
  std::string serving_line;
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&line_or_eof), options_.startup_timeout);
    const size_t start = stdout_text_.find(kServingPrefix);
    if (start != std::string::npos) {
      const size_t end = stdout_text_.find('\n', start);
      if (end != std::string::npos) serving_line = stdout_text_.substr(start, end - start);
    }
  }

  if (serving_line.empty()) {
    // Timed out or exited early: report how, with what it printed. Closed stdout means the
    // child is exiting, so wait for its code; otherwise it is hung and gets killed at once.
    bool eof;
    {
      absl::MutexLock lock(&mu_);
      eof = stdout_eof_;
    }
    std::string how;
    absl::StatusOr<int> status =
        eof ? WaitForExit(absl::Seconds(10)) : absl::DeadlineExceededError("no serving line");
    if (status.ok()) {
      how = absl::StrCat("exited with code ", ExitCodeOf(*status), " before serving");
    } else {
      how = absl::StrCat("did not print its serving line within ",
                         absl::FormatDuration(options_.startup_timeout));
      KillAndReap(pid_);
      pid_ = -1;
      JoinReader();
    }
    return absl::UnavailableError(
        absl::StrCat("jobbroker (", BrokerBinaryPath(), ") ", how, "\n", DescribeOutput()));
  }

  for (absl::string_view token :
       absl::StrSplit(absl::StripPrefix(serving_line, kServingPrefix), ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&token, "grpc=")) address_ = std::string(token);
    if (absl::ConsumePrefix(&token, "http=")) http_address_ = std::string(token);
  }
  if (address_.empty() || absl::EndsWith(address_, ":0")) {
    return absl::InternalError(absl::StrCat("cannot parse serving line: ", serving_line));
  }
  return absl::OkStatus();
}

void BrokerProcess::ReadStdoutUntilEof(int fd) {
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    absl::MutexLock lock(&mu_);
    stdout_text_.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  stdout_eof_ = true;
}

void BrokerProcess::JoinReader() {
  if (stdout_reader_.joinable()) stdout_reader_.join();
}

absl::StatusOr<int> BrokerProcess::WaitForExit(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no broker process is running");
  absl::StatusOr<int> status = WaitPid(pid_, timeout);
  if (status.ok()) {
    pid_ = -1;
    JoinReader();
  }
  return status;
}

void BrokerProcess::Kill9() {
  if (pid_ <= 0) return;
  KillAndReap(pid_);
  pid_ = -1;
  JoinReader();
}

absl::StatusOr<int> BrokerProcess::Terminate(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no broker process is running");
  if (kill(pid_, SIGTERM) != 0) return ErrnoError("kill SIGTERM");
  absl::StatusOr<int> status = WaitForExit(timeout);
  if (!status.ok()) {
    Kill9();
    return absl::DeadlineExceededError(absl::StrCat("jobbroker did not exit within ",
                                                    absl::FormatDuration(timeout),
                                                    " of SIGTERM; killed it\n", DescribeOutput()));
  }
  return ExitCodeOf(*status);
}

absl::StatusOr<int> BrokerProcess::AwaitExit(absl::Duration timeout) {
  absl::StatusOr<int> status = WaitForExit(timeout);
  if (!status.ok()) return status.status();
  return ExitCodeOf(*status);
}

absl::Status BrokerProcess::Restart() {
  if (pid_ > 0) {
    absl::StatusOr<int> code = Terminate();
    if (!code.ok()) return code.status();
  }
  return Launch();
}

std::string BrokerProcess::ReadStderr() const {
  return stderr_path_.empty() ? "" : ReadWholeFile(stderr_path_);
}

std::string BrokerProcess::ReadStdout() const {
  absl::MutexLock lock(&mu_);
  return stdout_text_;
}

std::string BrokerProcess::DescribeOutput() const {
  return absl::StrCat("--- stderr (", stderr_path_, ") ---\n", ReadStderr(), "\n--- stdout ---\n",
                      ReadStdout(), "\n--- end ---");
}

std::shared_ptr<grpc::Channel> BrokerProcess::NewChannel() const {
  return testing::NewChannel(address_);
}

std::unique_ptr<jobbroker::v1::Broker::Stub> BrokerProcess::NewBrokerStub() const {
  return jobbroker::v1::Broker::NewStub(NewChannel());
}

std::unique_ptr<jobbroker::v1::Admin::Stub> BrokerProcess::NewAdminStub() const {
  return jobbroker::v1::Admin::NewStub(NewChannel());
}

absl::StatusOr<ExitResult> RunBrokerToExit(const TempDir& dir, const std::vector<std::string>& args,
                                           absl::Duration timeout) {
  static std::atomic<int> counter{0};
  const int n = counter.fetch_add(1);
  std::vector<std::string> argv = {BrokerBinaryPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  const ChildStreams streams = {.stdout_path = absl::StrCat(dir.path(), "/run-", n, ".stdout"),
                                .stderr_path = absl::StrCat(dir.path(), "/run-", n, ".stderr"),
                                .truncate = true};
  absl::StatusOr<pid_t> pid = SpawnChild(std::move(argv), streams);
  if (!pid.ok()) return pid.status();
  absl::StatusOr<int> status = WaitPid(*pid, timeout);
  ExitResult result;
  if (!status.ok()) KillAndReap(*pid);
  result.stdout_text = ReadWholeFile(streams.stdout_path);
  result.stderr_text = ReadWholeFile(streams.stderr_path);
  if (!status.ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat("jobbroker still running after ", absl::FormatDuration(timeout),
                     "; killed it\n--- stderr ---\n", result.stderr_text, "\n--- stdout ---\n",
                     result.stdout_text));
  }
  result.exit_code = ExitCodeOf(*status);
  return result;
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         int* serving_status, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return client::CheckHealth(&ctx, channel, service, serving_status);
}

}  // namespace jobbroker::testing
