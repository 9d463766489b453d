#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace jobbroker::testing {

// Small helpers shared by BrokerProcess, ChildProcess and the crash harness.

// Where a spawned child's standard streams go: stdin from `stdin_path`; stdout to `stdout_fd`
// if it is >= 0, else to the file `stdout_path`; stderr to the file `stderr_path`, or with
// stdout if that is empty. Files are appended to, or truncated first if `truncate`.
struct ChildStreams {
  std::string stdin_path = "/dev/null";
  int stdout_fd = -1;
  std::string stdout_path;
  std::string stderr_path;
  bool truncate = false;
};

// Forks and execs `argv` (argv[0] is the program's path) with `streams`. The child gets SIGKILL
// if the thread that spawned it exits (PR_SET_PDEATHSIG), so a crashed parent leaves nothing
// behind. FAILED_PRECONDITION if argv[0] is not executable; the child's pid otherwise.
absl::StatusOr<pid_t> SpawnChild(std::vector<std::string> argv, const ChildStreams& streams);

// INTERNAL "<what>: <strerror(errno)>".
absl::Status ErrnoError(absl::string_view what);
// The file's bytes; empty if it cannot be read.
std::string ReadWholeFile(const std::string& path);
// Exit code of a wait status: the code itself, or 128 + signal like a shell reports it.
int ExitCodeOf(int wait_status);
// Waits up to `timeout` for `pid` to exit; the raw wait status, or DEADLINE_EXCEEDED.
absl::StatusOr<int> WaitPid(pid_t pid, absl::Duration timeout);
// SIGKILLs `pid` and reaps it; the raw wait status.
int KillAndReap(pid_t pid);

// A loopback port below the kernel's ephemeral range that is free now, for a process that is
// killed and restarted on the same port while its clients reconnect (the crash and cluster
// harnesses): outside the ephemeral range, no program binding port 0 while ours is down can be
// handed it and take our clients' calls. Random (not from a run's seed): callers that need
// several ports check they differ.
absl::StatusOr<int> PortBelowEphemeralRange();

}  // namespace jobbroker::testing
