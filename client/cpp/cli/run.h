#pragma once

#include <string>
#include <vector>

#include "client/cpp/cli/commands.h"

namespace jobbroker::cli {

// Runs the CLI on `args` (argv without the program name) and returns the exit code (ExitCode).
// Finds the command, parses its flags and the global ones (which may come before or after the
// command), dials the broker and runs it.
int RunCli(const std::vector<std::string>& args, Io& io);

}  // namespace jobbroker::cli
