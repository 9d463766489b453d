#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace jobbroker::testing {

// A helper program (Prometheus, say; the crash harness's broker, producers and workers) run as a
// child process for the length of a test, with its stdout and stderr in one log file. The
// destructor stops a child still running (SIGTERM, then SIGKILL after 10 s). The child also gets
// SIGKILL if the thread that started it exits (PR_SET_PDEATHSIG), so a crashed test leaves nothing
// behind: start it from the test's main thread. Not thread-safe.
class ChildProcess {
 public:
  // Execs `argv` (argv[0] is the program's path) with stdin from /dev/null and stdout and stderr
  // appended to `log_path`. Fails only if the program is not executable or fork fails.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(std::vector<std::string> argv,
                                                             std::string log_path);
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // False once the child has exited (it is reaped then, and exit_code() says how it ended).
  bool Running();
  // Exit code, or 128 + signal number if a signal ended it; -1 while it runs.
  int exit_code() const { return exit_code_; }
  // SIGTERM, up to `grace` for the exit, then SIGKILL. Returns the exit code, or 128 + signal
  // number if a signal ended it; FAILED_PRECONDITION if it had already been stopped.
  // A paused child is continued first.
  absl::StatusOr<int> Stop(absl::Duration grace = absl::Seconds(10));
  // SIGKILL, then reaps: when this returns the child is gone and wrote its last byte.
  void Kill9();
  // SIGSTOP, then waits until the kernel reports the child stopped (every thread of it).
  absl::Status Pause();
  // SIGCONT.
  absl::Status Continue();
  // What the child wrote so far.
  std::string ReadLog() const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_;
  int exit_code_ = -1;
  const std::string log_path_;
};

struct CommandResult {
  // Exit code, or 128 + signal number if a signal ended it.
  int exit_code = 0;
  // stdout and stderr, interleaved as written.
  std::string output;
};

// Runs `argv` to its end with `stdin_text` on its stdin, e.g. `promtool check metrics`. The
// input and output go through files in `work_dir` (no pipes to deadlock on). DEADLINE_EXCEEDED
// (after killing it) if it runs longer than `timeout`.
absl::StatusOr<CommandResult> RunCommand(const std::string& work_dir, std::vector<std::string> argv,
                                         absl::string_view stdin_text = "",
                                         absl::Duration timeout = absl::Seconds(60));

}  // namespace jobbroker::testing
