#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/observer.h"

namespace jobbroker::server {

// How far a starting broker's recovery has got, in words: the dashboard's API answers with it
// until the broker serves (server/http/http_server.h), so that an operator who opens the
// dashboard during a long restart sees it moving instead of a bare "starting".
//
// Thread-safe: partitions recover on threads of their own; the HTTP server's threads read.
class RecoveryStatus final : public core::BrokerObserver {
 public:
  // "no partition has begun its recovery yet" (the data dir opening; in cluster mode, etcd
  // awaited too); else each partition still recovering (at most kListed of them, in partition
  // order) with the jobs it has loaded, and how many are done, e.g. "1 partition recovered;
  // partition 3: 4,259,840 jobs loaded in 5.2 s".
  std::string Describe() const;

  void RecoveryStarted(uint32_t partition) override;
  void Recovering(uint32_t partition, size_t jobs, absl::Duration elapsed) override;
  void Recovered(uint32_t partition, size_t jobs, size_t expired_leases,
                 absl::Duration took) override;

  static constexpr size_t kListed = 4;

 private:
  struct Progress {
    bool done = false;
    size_t jobs = 0;
    absl::Duration elapsed;  // at the last report
  };

  mutable absl::Mutex mu_;
  std::map<uint32_t, Progress> partitions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker::server
