#include "server/storage_health.h"

#include "jobbroker/v1/broker.grpc.pb.h"

namespace jobbroker {

void StorageHealth::Attach(HttpServer* http, grpc::HealthCheckServiceInterface* health) {
  absl::MutexLock lock(&mu_);
  http_ = http;
  health_ = health;
  Set(writable_);
}

void StorageHealth::StoreFailed(const absl::Status&) {
  absl::MutexLock lock(&mu_);
  Set(false);
}

void StorageHealth::StoreResumed(const absl::Status&, absl::Duration) {
  absl::MutexLock lock(&mu_);
  Set(true);
}

void StorageHealth::Set(bool writable) {
  writable_ = writable;
  if (http_ != nullptr) http_->SetReady(writable);
  if (health_ != nullptr) health_->SetServingStatus(v1::Broker::service_full_name(), writable);
}

}  // namespace jobbroker
