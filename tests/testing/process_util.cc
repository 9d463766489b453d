#include "tests/testing/process_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace jobbroker::testing {

absl::StatusOr<pid_t> SpawnChild(std::vector<std::string> argv, const ChildStreams& streams) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(argv[0], " is not executable: ", std::strerror(errno)));
  }
  // Everything the child touches is prepared before fork(): the parent has other threads
  // (gRPC's), so the child may only make async-signal-safe calls until execv.
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const char* stdin_path = streams.stdin_path.c_str();
  const char* stdout_path = streams.stdout_path.c_str();
  const char* stderr_path = streams.stderr_path.empty() ? nullptr : streams.stderr_path.c_str();
  const int flags = O_WRONLY | O_CREAT | (streams.truncate ? O_TRUNC : O_APPEND);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    const int in = open(stdin_path, O_RDONLY);
    const int out = streams.stdout_fd >= 0 ? streams.stdout_fd : open(stdout_path, flags, 0644);
    const int err = stderr_path == nullptr ? out : open(stderr_path, flags, 0644);
    if (in < 0 || out < 0 || err < 0) _exit(125);
    dup2(in, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(args[0], args.data());
    static constexpr char kMsg[] = "execv failed\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(127);
  }
  return pid;
}

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

absl::StatusOr<int> WaitPid(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid, " still running after ", absl::FormatDuration(timeout)));
    }
    // Polling is fine here: this only runs while a process is shutting down.
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

absl::StatusOr<int> PortBelowEphemeralRange() {
  int low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> low;
  const int hi = std::min(low, 32768) - 1;
  const int lo = std::max(1024, hi - 12000);
  std::random_device device;
  std::mt19937 pick(device());
  for (int i = 0; i < 100; ++i) {
    const int port = std::uniform_int_distribution<int>(lo, hi)(pick);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  return absl::UnavailableError(absl::StrCat("no free port in ", lo, "..", hi));
}

}  // namespace jobbroker::testing
