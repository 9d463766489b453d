#include "client/cpp/cli/run.h"

#include <algorithm>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/cli/connection.h"
#include "client/cpp/cli/usage.h"

namespace jobbroker::cli {
namespace {

// The subcommands of a command group ("policy": get, set), in the order the usage lists them;
// empty if `group` is not one.
std::vector<std::string> Subcommands(const std::string& group) {
  std::vector<std::string> subs;
  const std::string prefix = absl::StrCat(group, " ");
  for (const Command& c : Commands()) {
    if (absl::StartsWith(c.name, prefix)) subs.push_back(c.name.substr(prefix.size()));
  }
  return subs;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

int GeneralUsageError(Io& io, const std::string& message) {
  io.err << "error: " << message << "\nRun 'jobbroker-cli help' for usage.\n";
  return kExitUsage;
}

// `help [COMMAND]`.
int RunHelp(const std::vector<std::string>& words, Io& io) {
  if (words.empty()) {
    io.out << GeneralUsage();
    return kExitOk;
  }
  std::string name = words[0];
  const std::vector<std::string> subs = Subcommands(name);
  if (!subs.empty() && words.size() > 1) name = absl::StrCat(name, " ", words[1]);
  if (!subs.empty() && words.size() == 1) {
    // The group: the first subcommand in full, the others' usage lines.
    io.out << CommandUsage(*FindCommand(absl::StrCat(name, " ", subs[0]))) << "\n";
    for (size_t i = 1; i < subs.size(); ++i)
      io.out << UsageLine(*FindCommand(absl::StrCat(name, " ", subs[i]))) << "\n";
    return kExitOk;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) return GeneralUsageError(io, absl::StrCat("unknown command ", name));
  io.out << CommandUsage(*command);
  return kExitOk;
}

}  // namespace

int RunCli(const std::vector<std::string>& raw_args, Io& io) {
  // -h is --help's short form; the parser only knows long flags.
  std::vector<std::string> args = raw_args;
  for (std::string& a : args) {
    if (a == "--") break;
    if (a == "-h") a = "--help";
  }

  // Global flags before the command; parsing stops at the command's name.
  absl::StatusOr<ParsedArgs> leading = ParseArgs(args, GlobalFlags(), /*stop_at_positional=*/true);
  if (!leading.ok()) return GeneralUsageError(io, std::string(leading.status().message()));
  std::vector<std::string> words = std::move(leading->positional);
  if (words.empty()) {
    if (leading->Has("--help")) {
      io.out << GeneralUsage();
      return kExitOk;
    }
    // A bare `jobbroker-cli` is a usage error too, so a script that lost its arguments fails.
    io.err << GeneralUsage();
    return kExitUsage;
  }
  if (words[0] == "help") return RunHelp({words.begin() + 1, words.end()}, io);

  std::string name = words[0];
  size_t consumed = 1;
  if (const std::vector<std::string> subs = Subcommands(name); !subs.empty()) {
    if (words.size() >= 2 && words[1] == "--help") return RunHelp({name}, io);
    if (words.size() < 2 || std::find(subs.begin(), subs.end(), words[1]) == subs.end()) {
      return GeneralUsageError(
          io, absl::StrCat(name, " needs a subcommand: ", absl::StrJoin(subs, ", ")));
    }
    name = absl::StrCat(name, " ", words[1]);
    consumed = 2;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) return GeneralUsageError(io, absl::StrCat("unknown command ", name));

  std::vector<FlagSpec> specs = command->flags;
  specs.insert(specs.end(), GlobalFlags().begin(), GlobalFlags().end());
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(std::vector<std::string>(words.begin() + consumed, words.end()), specs);
  if (!parsed.ok()) {
    io.err << "error: " << parsed.status().message() << "\n" << UsageLine(*command) << "\n";
    return kExitUsage;
  }
  // enqueue's and watch's own --timeout (a job's run-time limit; how long to watch) has the name
  // of the global deadline of each call. For them the deadline is what comes before the
  // command's name and their own flag what comes after it, so that neither sets the other: an
  // `enqueue --timeout 10ms` gave its own call 10 ms to be answered, and `--timeout 5s enqueue`
  // gave the job a 5 s limit.
  const bool own_timeout =
      std::any_of(command->flags.begin(), command->flags.end(),
                  [](const FlagSpec& flag) { return flag.name == "--timeout"; });
  std::optional<std::string> call_timeout;  // for those; the others read the merged flags
  if (own_timeout) {
    call_timeout = leading->Get("--timeout");
    leading->flags.erase("--timeout");
  }
  ParsedArgs all = *std::move(leading);
  all.positional = std::move(parsed->positional);
  all.MergeFlags(*parsed);
  if (all.Has("--help")) {
    io.out << CommandUsage(*command);
    return kExitOk;
  }

  client::ClientOptions options;
  // One command makes one call at a time: coalescing would have nothing to merge, and --timeout
  // then bounds each call on its own, routing included, as it always has.
  options.batching = false;
  options.address = all.Get("--address").value_or(client::DefaultAddress());
  std::string problem;
  if (client::SplitAddresses(options.address).empty()) {
    problem = "--address must name at least one HOST:PORT";
  }
  if (auto v = own_timeout ? call_timeout : all.Get("--timeout")) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationValue("--timeout", *v);
    if (!timeout.ok()) {
      problem = std::string(timeout.status().message());
    } else if (*timeout <= absl::ZeroDuration()) {
      problem = "--timeout must be positive";
    } else {
      options.timeout = *timeout;
    }
  }
  if (problem.empty()) {
    if (absl::Status s = ApplyConnectionFlags(all, options); !s.ok())
      problem = std::string(s.message());
  }
  if (problem.empty() &&
      (all.positional.size() < command->min_args || all.positional.size() > command->max_args)) {
    problem = all.positional.size() < command->min_args
                  ? "missing arguments"
                  : absl::StrCat("unexpected argument ", all.positional[command->max_args]);
  }
  if (!problem.empty()) {
    io.err << "error: " << problem << "\n" << UsageLine(*command) << "\n";
    return kExitUsage;
  }

  client::Client client(std::move(options));
  CommandContext ctx{
      .command = *command, .args = all, .client = client, .json = all.Has("--json"), .io = io};
  return command->run(ctx);
}

}  // namespace jobbroker::cli
