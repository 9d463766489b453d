#include "server/observability/storage_health.h"

#include <utility>

namespace jobbroker::server {

void StorageHealth::Attach(std::function<void(bool writable)> report) {
  absl::MutexLock lock(&mu_);
  report_ = std::move(report);
  SetLocked(writable_);
}

void StorageHealth::StoreFailed(const absl::Status&) {
  absl::MutexLock lock(&mu_);
  SetLocked(false);
}

void StorageHealth::StoreResumed(const absl::Status&, absl::Duration) {
  absl::MutexLock lock(&mu_);
  SetLocked(true);
}

void StorageHealth::SetLocked(bool writable) {
  writable_ = writable;
  if (report_) report_(writable);
}

}  // namespace jobbroker::server
