#include "tests/testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
namespace {

// Forks and execs `argv` with stdin from `stdin_path` and stdout+stderr appended to
// `output_path`. Everything the child touches is prepared before fork(): the test process has
// other threads (gRPC's), so the child may only make async-signal-safe calls until execv.
absl::StatusOr<pid_t> Spawn(std::vector<std::string>& argv, const std::string& stdin_path,
                            const std::string& output_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(argv[0], " is not executable: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    const int in = open(stdin_path.c_str(), O_RDONLY);
    const int out = open(output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0) _exit(125);
    dup2(in, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(args[0], args.data());
    static constexpr char kMsg[] = "child_process: execv failed\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(std::vector<std::string> argv,
                                                                  std::string log_path) {
  absl::StatusOr<pid_t> pid = Spawn(argv, "/dev/null", log_path);
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
  kill(pid_, SIGTERM);
  absl::StatusOr<int> status = WaitPid(pid_, grace);
  exit_code_ = status.ok() ? ExitCodeOf(*status) : ExitCodeOf(KillAndReap(pid_));
  pid_ = -1;
  return exit_code_;
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
  absl::StatusOr<pid_t> pid = Spawn(argv, stdin_path, output_path);
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
