#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/cli/args.h"
#include "jobbroker/client.h"

namespace jobbroker::cli {

// Exit codes, for scripts; the usage text lists them.
enum ExitCode : int {
  kExitOk = 0,
  // The broker answered with an error (NOT_FOUND, INVALID_ARGUMENT, ...).
  kExitRefused = 1,
  // The command line is wrong; nothing was sent.
  kExitUsage = 2,
  // The broker could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED), after the client's
  // retries where a retry is safe.
  kExitUnreachable = 3,
  // `watch` and `enqueue --wait`: the job ended FAILED (dead) or CANCELLED.
  kExitJobFailed = 4,
  kExitJobCancelled = 5,
};

// Where a command reads and writes. Human and JSON output go to `out`, errors and notes to
// `err`.
struct Io {
  std::istream& in;
  std::ostream& out;
  std::ostream& err;
  // Whether `in` is a terminal: enqueue reads a payload from stdin only when it is not.
  bool in_is_terminal = false;
};

struct Command;

// What a command runs with.
struct CommandContext {
  const Command& command;
  // The command's own positional arguments (after its name) and every flag given.
  const ParsedArgs& args;
  client::Client& client;
  // --json: machine-readable output.
  bool json = false;
  Io& io;
};

// One command of the CLI, as the dispatcher and the usage text see it.
struct Command {
  // "enqueue", or two words for a subcommand: "policy get".
  std::string name;
  // Positional arguments in usage text: "QUEUE [PAYLOAD]".
  std::string args_usage;
  // One line for the command list.
  std::string summary;
  // More about it, for `help COMMAND`; may be empty.
  std::string details;
  // How many positional arguments it takes.
  size_t min_args = 0;
  size_t max_args = 0;
  // Its own flags (the global ones are added by the dispatcher).
  std::vector<FlagSpec> flags;
  // Returns the exit code; prints its own output and errors.
  int (*run)(CommandContext& ctx) = nullptr;
};

// Every command, in the order the usage text lists them.
const std::vector<Command>& Commands();
// Flags every command accepts (--address, --json, --timeout, the token and TLS flags, --help).
const std::vector<FlagSpec>& GlobalFlags();

// Prints "error: <message>" and the command's usage line to io.err; returns kExitUsage.
int UsageError(const CommandContext& ctx, const std::string& message);
// Prints "error: <CODE>: <message>" to io.err; returns kExitUnreachable for UNAVAILABLE and
// DEADLINE_EXCEEDED, else kExitRefused.
int BrokerError(const CommandContext& ctx, const absl::Status& status);

// The commands, defined in job_commands.cc and queue_commands.cc.
int RunEnqueue(CommandContext& ctx);
int RunGet(CommandContext& ctx);
int RunWatch(CommandContext& ctx);
int RunList(CommandContext& ctx);
int RunCancel(CommandContext& ctx);
int RunRetry(CommandContext& ctx);
int RunDelete(CommandContext& ctx);
int RunQueues(CommandContext& ctx);
int RunWorkers(CommandContext& ctx);
int RunPause(CommandContext& ctx);
int RunResume(CommandContext& ctx);
int RunPurge(CommandContext& ctx);
int RunPolicyGet(CommandContext& ctx);
int RunPolicySet(CommandContext& ctx);
int RunSchedules(CommandContext& ctx);
int RunSchedulePut(CommandContext& ctx);
int RunScheduleGet(CommandContext& ctx);
int RunScheduleDelete(CommandContext& ctx);
int RunScheduleRun(CommandContext& ctx);
int RunSchedulePause(CommandContext& ctx);
int RunScheduleResume(CommandContext& ctx);
int RunHealth(CommandContext& ctx);
int RunCluster(CommandContext& ctx);

}  // namespace jobbroker::cli
