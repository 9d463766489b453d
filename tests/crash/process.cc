#include "tests/crash/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace jobbroker::crash {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(std::vector<std::string> argv,
                                                        const std::string& output_path) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  if (access(argv[0].c_str(), X_OK) != 0) return ErrnoError(absl::StrCat("access ", argv[0]));
  // Everything the child touches is built before fork(): the driver has gRPC threads, so the
  // child may only make async-signal-safe calls until execv.
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const char* out_path = output_path.c_str();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    const int in = open("/dev/null", O_RDONLY);
    const int out = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0) _exit(125);
    dup2(in, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(args[0], args.data());
    static constexpr char kMsg[] = "crash harness: execv failed\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(127);
  }
  return std::unique_ptr<Process>(new Process(pid));
}

Process::~Process() {
  if (Running()) Kill9();
}

void Process::Reaped(int wait_status) {
  exit_code_ = ExitCodeOf(wait_status);
  pid_ = -1;
}

bool Process::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
  Reaped(status);
  return false;
}

void Process::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  Reaped(status);
}

absl::Status Process::Stop() {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  if (kill(pid_, SIGSTOP) != 0) return ErrnoError("kill SIGSTOP");
  // The parent hears of a stop only once the whole thread group has stopped.
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WUNTRACED);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("waitpid");
    if (WIFSTOPPED(status)) return absl::OkStatus();
    Reaped(status);
    return absl::FailedPreconditionError("exited instead of stopping");
  }
}

absl::Status Process::Continue() {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  if (kill(pid_, SIGCONT) != 0) return ErrnoError("kill SIGCONT");
  return absl::OkStatus();
}

int Process::Terminate(absl::Duration grace) {
  if (!Running()) return exit_code_;
  kill(pid_, SIGCONT);  // a stopped child cannot act on SIGTERM
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (!Running()) return exit_code_;
    absl::SleepFor(absl::Milliseconds(10));
  }
  Kill9();
  return exit_code_;
}

}  // namespace jobbroker::crash
