#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace jobbroker::testing {

// Small helpers shared by BrokerProcess and ChildProcess.

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

}  // namespace jobbroker::testing
