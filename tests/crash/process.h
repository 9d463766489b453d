#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace jobbroker::crash {

// One child process of the harness (the broker, a producer, a worker), with the signals the
// driver sends it. Its stdout and stderr are appended to one file. The child gets SIGKILL if the
// thread that spawned it exits (PR_SET_PDEATHSIG), so a crashed driver leaves nothing behind:
// spawn from the driver's main thread. The destructor SIGKILLs a child still running. Not
// thread-safe.
class Process {
 public:
  // Execs `argv` (argv[0] is the program's path) with stdin from /dev/null.
  static absl::StatusOr<std::unique_ptr<Process>> Spawn(std::vector<std::string> argv,
                                                        const std::string& output_path);
  ~Process();

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // False once the child has exited; it is reaped then and exit_code() holds how it ended.
  bool Running();
  // Exit code, or 128 + signal number; -1 while running.
  int exit_code() const { return exit_code_; }

  // SIGKILL, then reaps: when this returns the child is gone and wrote its last byte.
  void Kill9();
  // SIGSTOP, then waits until the kernel reports the child stopped (every thread of it).
  absl::Status Stop();
  // SIGCONT.
  absl::Status Continue();
  // SIGTERM, up to `grace` for the exit, then SIGKILL. Returns the exit code.
  int Terminate(absl::Duration grace);

 private:
  explicit Process(pid_t pid) : pid_(pid) {}
  void Reaped(int wait_status);

  pid_t pid_;
  int exit_code_ = -1;
};

}  // namespace jobbroker::crash
