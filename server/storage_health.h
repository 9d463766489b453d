#pragma once

#include <grpcpp/health_check_service_interface.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/observer.h"
#include "server/http_server.h"

namespace jobbroker {

// Keeps readiness in step with the store: while a store failure (disk full, I/O error) makes the
// broker refuse every change, GET /readyz answers 503 and the gRPC health of
// "jobbroker.v1.Broker" (every method of which writes) is NOT_SERVING. The whole server's
// health ("") stays SERVING: the process is alive, reads work, and a restart would not free the
// disk, so a liveness probe must not restart it.
//
// Thread-safe: the broker reports from its writer and ticker threads.
class StorageHealth final : public BrokerObserver {
 public:
  // From now on reports to `http` and `health` (borrowed; they must outlive the broker's last
  // event), starting with the state the events so far left.
  void Attach(HttpServer* http, grpc::HealthCheckServiceInterface* health);

  void StoreFailed(const absl::Status& status) override;
  void StoreResumed(const absl::Status& cause, absl::Duration outage) override;

 private:
  void Set(bool writable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  bool writable_ ABSL_GUARDED_BY(mu_) = true;
  HttpServer* http_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace jobbroker
