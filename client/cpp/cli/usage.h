#pragma once

#include <string>

#include "client/cpp/cli/commands.h"

namespace jobbroker::cli {

// The text of `jobbroker-cli help`: commands, global flags, duration syntax, exit codes.
std::string GeneralUsage();
// The text of `jobbroker-cli help COMMAND`: its usage line, details and flags.
std::string CommandUsage(const Command& command);
// "usage: jobbroker-cli enqueue QUEUE [PAYLOAD] [flags]"
std::string UsageLine(const Command& command);

}  // namespace jobbroker::cli
