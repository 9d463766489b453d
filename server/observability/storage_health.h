#pragma once

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/observer.h"

namespace jobbroker::server {

// Keeps readiness in step with the store: while a store failure (disk full, I/O error) makes the
// broker refuse every change, GET /readyz answers 503 and the gRPC health of
// "jobbroker.v1.Broker" (every method of which writes) is NOT_SERVING. The whole server's
// health ("") stays SERVING: the process is alive, reads work, and a restart would not free the
// disk, so a liveness probe must not restart it.
//
// Thread-safe: the broker reports from its writer and ticker threads.
class StorageHealth final : public core::BrokerObserver {
 public:
  // From now on reports whether the store is writable to `report` (main.cc sets /readyz and the
  // Broker service's gRPC health from it; what it uses must outlive the broker's last event),
  // starting with the state the events so far left. Called under a lock, so keep it short.
  void Attach(std::function<void(bool writable)> report);

  void StoreFailed(const absl::Status& status) override;
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override;

 private:
  void SetLocked(bool writable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  bool writable_ ABSL_GUARDED_BY(mu_) = true;
  std::function<void(bool writable)> report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
