#include "tests/testing/child_process.h"

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/process_util.h"

namespace jobbroker::testing {
absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(std::vector<std::string> argv,
                                                                  std::string log_path) {
  absl::StatusOr<pid_t> pid = SpawnChild(std::move(argv), {.stdout_path = log_path});
  if (!pid.ok()) return pid.status();
  return std::unique_ptr<ChildProcess>(new ChildProcess(*pid, std::move(log_path)));
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) (void)Stop();
}

bool ChildProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
  exit_code_ = ExitCodeOf(status);
  pid_ = -1;
  return false;
}

absl::StatusOr<int> ChildProcess::Stop(absl::Duration grace) {
  if (!Running()) {
    if (exit_code_ >= 0) return exit_code_;
    return absl::FailedPreconditionError("the child process was already stopped");
  }
  kill(pid_, SIGCONT);  // a paused child cannot act on SIGTERM
  kill(pid_, SIGTERM);
  absl::StatusOr<int> status = WaitPid(pid_, grace);
  exit_code_ = status.ok() ? ExitCodeOf(*status) : ExitCodeOf(KillAndReap(pid_));
  pid_ = -1;
  return exit_code_;
}

void ChildProcess::Kill9() {
  if (pid_ <= 0) return;
  exit_code_ = ExitCodeOf(KillAndReap(pid_));
  pid_ = -1;
}

absl::Status ChildProcess::Pause() {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  if (kill(pid_, SIGSTOP) != 0) return ErrnoError("kill SIGSTOP");
  // The parent hears of a stop only once the whole thread group has stopped.
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WUNTRACED);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("waitpid");
    if (WIFSTOPPED(status)) return absl::OkStatus();
    exit_code_ = ExitCodeOf(status);
    pid_ = -1;
    return absl::FailedPreconditionError("exited instead of stopping");
  }
}

absl::Status ChildProcess::Continue() {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  if (kill(pid_, SIGCONT) != 0) return ErrnoError("kill SIGCONT");
  return absl::OkStatus();
}

std::string ChildProcess::ReadLog() const { return ReadWholeFile(log_path_); }

absl::StatusOr<CommandResult> RunCommand(const std::string& work_dir, std::vector<std::string> argv,
                                         absl::string_view stdin_text, absl::Duration timeout) {
  static std::atomic<int> counter{0};
  const int n = counter.fetch_add(1);
  const std::string stdin_path = absl::StrCat(work_dir, "/command-", n, ".stdin");
  const std::string output_path = absl::StrCat(work_dir, "/command-", n, ".output");
  {
    std::ofstream in(stdin_path, std::ios::binary | std::ios::trunc);
    in.write(stdin_text.data(), static_cast<std::streamsize>(stdin_text.size()));
    if (!in) return absl::InternalError(absl::StrCat("cannot write ", stdin_path));
  }
  const std::string command_line = absl::StrJoin(argv, " ");
  absl::StatusOr<pid_t> pid =
      SpawnChild(std::move(argv), {.stdin_path = stdin_path, .stdout_path = output_path});
  if (!pid.ok()) return pid.status();
  absl::StatusOr<int> status = WaitPid(*pid, timeout);
  if (!status.ok()) {
    KillAndReap(*pid);
    return absl::DeadlineExceededError(
        absl::StrCat(command_line, " still running after ", absl::FormatDuration(timeout),
                     "; killed it. Output:\n", ReadWholeFile(output_path)));
  }
  return CommandResult{ExitCodeOf(*status), ReadWholeFile(output_path)};
}

}  // namespace jobbroker::testing
