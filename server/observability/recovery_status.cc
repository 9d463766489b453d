#include "server/observability/recovery_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace jobbroker::server {
namespace {

// 4259840 -> "4,259,840": a count an operator reads at a glance.
std::string Grouped(size_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string RecoveryStatus::Describe() const {
  absl::MutexLock lock(&mu_);
  if (partitions_.empty()) return "no partition has begun its recovery yet";
  size_t done = 0;
  for (const auto& [partition, p] : partitions_) done += p.done ? 1 : 0;
  std::string out;
  if (done > 0) absl::StrAppend(&out, done, done == 1 ? " partition" : " partitions", " recovered");
  size_t listed = 0;
  for (const auto& [partition, p] : partitions_) {
    if (p.done) continue;
    if (listed == kListed) {
      absl::StrAppend(&out, "; ", partitions_.size() - done - listed, " more recovering");
      break;
    }
    absl::StrAppend(&out, out.empty() ? "" : "; ", "partition ", partition, ": ", Grouped(p.jobs),
                    p.jobs == 1 ? " job" : " jobs", " loaded");
    if (p.elapsed > absl::ZeroDuration())
      absl::StrAppend(&out, absl::StrFormat(" in %.1f s", absl::ToDoubleSeconds(p.elapsed)));
    ++listed;
  }
  return out;
}

void RecoveryStatus::RecoveryStarted(uint32_t partition) {
  absl::MutexLock lock(&mu_);
  partitions_[partition] = Progress{};
}

void RecoveryStatus::Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) {
  absl::MutexLock lock(&mu_);
  Progress& p = partitions_[partition];
  p.jobs = jobs;
  p.elapsed = elapsed;
}

void RecoveryStatus::Recovered(uint32_t partition, size_t jobs, size_t /*expired_leases*/,
                               absl::Duration took) {
  absl::MutexLock lock(&mu_);
  partitions_[partition] = Progress{.done = true, .jobs = jobs, .elapsed = took};
}

}  // namespace jobbroker::server
