#include "client/cpp/cli/run.h"

#include <ostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/cli/connection.h"
#include "client/cpp/cli/usage.h"

namespace jobbroker::cli {
namespace {

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
  if (name == "policy" && words.size() > 1) name = absl::StrCat(name, " ", words[1]);
  if (name == "policy") {
    io.out << CommandUsage(*FindCommand("policy get")) << "\n"
           << UsageLine(*FindCommand("policy set")) << "\n";
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
  if (name == "policy") {
    if (words.size() >= 2 && words[1] == "--help") return RunHelp({"policy"}, io);
    if (words.size() < 2 || (words[1] != "get" && words[1] != "set")) {
      return GeneralUsageError(io, "policy needs a subcommand: get or set");
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
  ParsedArgs all = *std::move(leading);
  all.positional = std::move(parsed->positional);
  all.MergeFlags(*parsed);
  if (all.Has("--help")) {
    io.out << CommandUsage(*command);
    return kExitOk;
  }

  client::ClientOptions options;
  options.address = all.Get("--address").value_or(client::DefaultAddress());
  std::string problem;
  if (client::SplitAddresses(options.address).empty()) {
    problem = "--address must name at least one HOST:PORT";
  }
  if (auto v = all.Get("--timeout")) {
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
