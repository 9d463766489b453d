#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "core/clock.h"

namespace jobbroker::cluster {

struct LeaseKeeperOptions {
  // The lease's time-to-live, as granted.
  absl::Duration ttl = absl::Seconds(3);
  // How often the lease is renewed. Default (zero): ttl / 3, so two renewals in a row may fail
  // before the holder must stop.
  absl::Duration renew_every = absl::ZeroDuration();
  // How soon a failed renewal is tried again. Default (zero): ttl / 10.
  absl::Duration retry_every = absl::ZeroDuration();
  // How long before the TTL would run out the holder stops serving. Default (zero): ttl / 6
  // (500 ms of a 3 s lease). It covers what the TTL count cannot see: the node's clock running
  // slower than etcd's, and the time from reading the clock to the holder's last answer. Must be
  // below the TTL.
  absl::Duration safety_margin = absl::ZeroDuration();
};

// Keeps one etcd lease alive (CLUSTER.md: every node holds one, its leader keys are attached to
// it) and says until when its holder may serve: "a leader that cannot renew its lease stops
// serving before the TTL runs out".
//
// The serving deadline is the send time of the last renewal that etcd answered (or the grant's,
// `renewed_at`) + the TTL etcd gave − the safety margin: etcd restarts the TTL when the request
// arrives, which is after it was sent, so the holder stops before etcd can let the lease go.
// Safety then depends on the clocks' rates only, not on their agreement, and the margin covers
// that.
//
// `on_lost` is called once, when the lease is lost: kNotFound when etcd says it is gone (expired,
// revoked), kDeadlineExceeded when it could not be renewed before the serving deadline. The
// keeper then stops; the caller must stop serving and grant a new lease. Renewals failing with
// kUnavailable are retried every `retry_every` until the deadline.
//
// Time is read from `clock`: Tick() is the whole logic, and tests and the simulator call it on a
// fake clock. Start() runs Tick on a thread of its own, sleeping (real time) until the next
// renewal or the deadline. Thread-safe, except that Tick must not run while the thread does.
class LeaseKeeper {
 public:
  // Keeps `lease` (granted with `options.ttl`, its grant sent at `renewed_at`) alive through
  // `etcd`. Borrows etcd and clock: they must outlive the keeper.
  LeaseKeeper(Etcd& etcd, const core::Clock& clock, LeaseId lease, absl::Time renewed_at,
              LeaseKeeperOptions options, std::function<void(absl::Status)> on_lost);
  // Stops the thread.
  ~LeaseKeeper();

  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Runs Tick on a thread until Stop() or the lease is lost.
  void Start();
  // Stops the thread (it finishes a renewal in flight first). Does not revoke the lease.
  void Stop();

  // One step: reports the loss if the deadline passed, renews the lease if that is due (one
  // KeepAliveOnce, which may block up to the client's call timeout), and returns how long until
  // the next step is due (InfiniteDuration once lost).
  absl::Duration Tick();

  LeaseId lease() const { return lease_; }
  // Whether the holder may serve now: not lost, and the clock before the serving deadline.
  bool MayServe() const;
  // Until when the holder may serve, if no renewal succeeds before.
  absl::Time serving_deadline() const;
  // OK while the lease is held; the status given to on_lost afterwards.
  absl::Status lost() const;

 private:
  void Run();
  // Marks the lease lost and reports it (outside mu_).
  void Lose(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  Etcd& etcd_;
  const core::Clock& clock_;
  const LeaseId lease_;
  const absl::Duration renew_every_;
  const absl::Duration retry_every_;
  const absl::Duration safety_margin_;
  const std::function<void(absl::Status)> on_lost_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  absl::Time next_renewal_ ABSL_GUARDED_BY(mu_);
  absl::Time last_renewed_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;
  std::thread thread_;
};

}  // namespace jobbroker::cluster
