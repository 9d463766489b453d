#include "tests/crash/verdict.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_join.h"

namespace jobbroker::crash {

int Verdict(const Report& report, const std::vector<std::string>& problems, uint64_t seed,
            const std::string& out_dir, bool keep) {
  if (!report.ok()) std::printf("\nVIOLATIONS\n%s", report.ViolationList().c_str());
  if (!problems.empty()) std::printf("\nRUN PROBLEMS\n%s\n", absl::StrJoin(problems, "\n").c_str());
  const bool green = report.ok() && problems.empty();
  std::printf("\n%s (seed %llu)\n", green ? "PASS" : "FAIL", static_cast<unsigned long long>(seed));
  if (green && !keep) {
    std::error_code ec;
    std::filesystem::remove_all(out_dir, ec);
  } else {
    std::printf("logs and data kept in %s\n", out_dir.c_str());
  }
  std::fflush(stdout);
  return green ? 0 : 1;
}

}  // namespace jobbroker::crash
