#include "client/cpp/cli/usage.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace jobbroker::cli {
namespace {

std::string FlagLines(const std::vector<FlagSpec>& flags) {
  std::vector<std::string> lefts;
  size_t width = 0;
  for (const FlagSpec& f : flags) {
    lefts.push_back(f.TakesValue() ? absl::StrCat(f.name, " ", f.value_name) : f.name);
    width = std::max(width, lefts.back().size());
  }
  std::string out;
  for (size_t i = 0; i < flags.size(); ++i) {
    absl::StrAppend(&out, "  ", lefts[i], std::string(width + 2 - lefts[i].size(), ' '),
                    flags[i].help, "\n");
  }
  return out;
}

constexpr char kTrailer[] =
    "Durations are Go-style: 1.5s, 200ms, 10m, 2h, 1h30m. Times are RFC 3339.\n"
    "\n"
    "Exit codes:\n"
    "  0  ok\n"
    "  1  the broker refused the request; stderr says \"error: CODE: message\"\n"
    "     (NOT_FOUND, INVALID_ARGUMENT, ALREADY_EXISTS, ...)\n"
    "  2  bad command line; nothing was sent\n"
    "  3  the broker could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED), after retries\n"
    "  4  watch, enqueue --wait: the job ended FAILED (dead)\n"
    "  5  watch, enqueue --wait: the job ended CANCELLED\n"
    "\n"
    "--address may list several nodes of a cluster (h1:7070,h2:7070): the first that answers\n"
    "tells where each partition's leader is, and each call goes straight there.\n"
    "\n"
    "A broker started with --auth-tokens wants a bearer token: put it in a file (--token-file)\n"
    "or in $JOBBROKER_TOKEN. There is no --token flag: the command line of a running program\n"
    "is visible to every user of the machine. Refusals are UNAUTHENTICATED (no or unknown\n"
    "token) and PERMISSION_DENIED (the token lacks the role or the queue), both exit code 1.\n";

}  // namespace

std::string UsageLine(const Command& command) {
  return absl::StrCat("usage: jobbroker-cli ", command.name, command.args_usage.empty() ? "" : " ",
                      command.args_usage, " [flags]");
}

std::string GeneralUsage() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Command& c : Commands()) {
    rows.emplace_back(absl::StrCat(c.name, c.args_usage.empty() ? "" : " ", c.args_usage),
                      c.summary);
  }
  rows.emplace_back("help [COMMAND]", "this text, or one command's details and flags");
  size_t width = 0;
  for (const auto& [left, summary] : rows) width = std::max(width, left.size());
  std::string out =
      "jobbroker-cli: enqueue jobs and inspect a jobbroker from the shell.\n"
      "\n"
      "usage: jobbroker-cli [--address HOST:PORT[,...]] [--json] [--timeout DURATION]\n"
      "                     [--token-file FILE] [--tls] [--tls-ca FILE]\n"
      "                     [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]\n"
      "                     COMMAND [ARGS]\n"
      "\n"
      "Commands:\n";
  for (const auto& [left, summary] : rows) {
    absl::StrAppend(&out, "  ", left, std::string(width + 2 - left.size(), ' '), summary, "\n");
  }
  absl::StrAppend(&out, "\nGlobal flags (before or after the command):\n", FlagLines(GlobalFlags()),
                  "\n", kTrailer);
  return out;
}

std::string CommandUsage(const Command& command) {
  std::string summary = command.summary;
  if (!summary.empty()) summary[0] = absl::ascii_toupper(static_cast<unsigned char>(summary[0]));
  std::string out = absl::StrCat(UsageLine(command), "\n\n", summary, ".\n");
  if (!command.details.empty()) absl::StrAppend(&out, command.details, "\n");
  if (!command.flags.empty()) absl::StrAppend(&out, "\nFlags:\n", FlagLines(command.flags));
  absl::StrAppend(&out, "\nGlobal flags:\n", FlagLines(GlobalFlags()), "\n", kTrailer);
  return out;
}

}  // namespace jobbroker::cli
