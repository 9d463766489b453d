#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd.h"
#include "core/clock.h"

namespace jobbroker::cluster {

struct AwaitEtcdOptions {
  // How long to keep trying, counted from the start of the first try (which may itself take the
  // client's connect timeout). Zero: one try.
  absl::Duration patience = absl::Seconds(60);
  // Pause between two tries (each try may itself take up to the client's call timeout).
  absl::Duration retry_every = absl::Milliseconds(250);
  // How often on_waiting is told while etcd does not answer: at the first failure, then once per
  // this much waiting, so a log shows the wait without a line per try.
  absl::Duration report_every = absl::Seconds(5);
};

// What AwaitEtcd needs from its caller besides etcd: the time, a way to pause, and where to say
// that it waits.
struct AwaitEtcdHooks {
  // Pauses for the duration (real time in the server; tests advance a fake clock).
  std::function<void(absl::Duration)> sleep;
  // Told of the last failure and how long the wait has lasted (see report_every). May be empty.
  std::function<void(const absl::Status& why, absl::Duration waited)> on_waiting;
};

// Reads `key` until etcd answers, for a node starting before (or beside) its etcd: under
// docker compose, a Kubernetes rollout or a test harness, etcd and the nodes start together,
// and etcd takes from a tenth of a second to several to serve (it elects itself leader first).
// Without the wait the node's first call would fail and it would exit.
//
// Only kUnavailable (etcd unreachable or silent: Etcd's retryable code) is waited on. Any other
// error is returned at once: a refused login or a bad TLS file does not heal by waiting. Returns
// OK once a read succeeded; kUnavailable, naming the patience and the last failure, once
// `options.patience` has passed since the first try. Time is read from `clock`.
absl::Status AwaitEtcd(Etcd& etcd, const std::string& key, const core::Clock& clock,
                       const AwaitEtcdOptions& options, const AwaitEtcdHooks& hooks);

}  // namespace jobbroker::cluster
