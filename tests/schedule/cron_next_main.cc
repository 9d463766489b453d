// cron_next: the differential test's window onto CronExpression::Next. Reads lines
//   <expression> TAB <zone> TAB <unix seconds>
// on stdin and writes one line for each: the next run in unix seconds, "none" if there is none,
// or "error: <message>" for an expression or zone that is refused. Exits 2 on a malformed line.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "schedule/cron.h"

int main() {
  using jobbroker::schedule::CronExpression;
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::vector<std::string> parts = absl::StrSplit(line, '\t');
    int64_t seconds = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[2], &seconds)) {
      std::cerr << "cron_next: expected <expression>\\t<zone>\\t<unix seconds>, got: " << line
                << "\n";
      return 2;
    }
    const absl::StatusOr<absl::TimeZone> zone = jobbroker::schedule::LoadZone(parts[1]);
    if (!zone.ok()) {
      std::cout << "error: " << zone.status().message() << "\n";
      continue;
    }
    const absl::StatusOr<CronExpression> cron = CronExpression::Parse(parts[0]);
    if (!cron.ok()) {
      std::cout << "error: " << cron.status().message() << "\n";
      continue;
    }
    const absl::Time next = cron->Next(absl::FromUnixSeconds(seconds), *zone);
    if (next == absl::InfiniteFuture()) {
      std::cout << "none\n";
    } else {
      std::cout << absl::ToUnixSeconds(next) << "\n";
    }
  }
  return 0;
}
