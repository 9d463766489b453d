#include "cluster/etcd/await_etcd.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::cluster {

absl::Status AwaitEtcd(Etcd& etcd, const std::string& key, const core::Clock& clock,
                       const AwaitEtcdOptions& options, const AwaitEtcdHooks& hooks) {
  const absl::Time start = clock.Now();
  const absl::Time give_up = start + options.patience;
  absl::Time next_report = start;
  while (true) {
    absl::StatusOr<GetResult> read = etcd.Get(key);
    if (read.ok()) return absl::OkStatus();
    if (read.status().code() != absl::StatusCode::kUnavailable) return read.status();
    const absl::Time now = clock.Now();
    if (now >= give_up) {
      return absl::UnavailableError(absl::StrCat("etcd did not answer within ",
                                                 absl::FormatDuration(options.patience), ": ",
                                                 read.status().message()));
    }
    if (now >= next_report) {
      if (hooks.on_waiting) hooks.on_waiting(read.status(), now - start);
      next_report = now + options.report_every;
    }
    hooks.sleep(std::min(options.retry_every, give_up - now));
  }
}

}  // namespace jobbroker::cluster
