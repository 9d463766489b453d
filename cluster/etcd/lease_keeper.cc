#include "cluster/etcd/lease_keeper.h"

#include <algorithm>
#include <functional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace jobbroker::cluster {

namespace {

absl::Duration OrDefault(absl::Duration value, absl::Duration fallback) {
  return value > absl::ZeroDuration() ? value : fallback;
}

}  // namespace

LeaseKeeper::LeaseKeeper(Etcd& etcd, const core::Clock& clock, LeaseId lease, absl::Time renewed_at,
                         LeaseKeeperOptions options, std::function<void(absl::Status)> on_lost)
    : etcd_(etcd),
      clock_(clock),
      lease_(lease),
      renew_every_(OrDefault(options.renew_every, options.ttl / 3)),
      retry_every_(OrDefault(options.retry_every, options.ttl / 10)),
      safety_margin_(std::min(OrDefault(options.safety_margin, options.ttl / 6), options.ttl)),
      on_lost_(std::move(on_lost)),
      deadline_(renewed_at + options.ttl - safety_margin_),
      next_renewal_(renewed_at + renew_every_),
      last_renewed_(renewed_at) {}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Run(); });
}

void LeaseKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void LeaseKeeper::Run() {
  for (;;) {
    const absl::Duration wait = Tick();
    absl::MutexLock lock(&mu_);
    if (stopping_ || !lost_.ok()) return;
    if (wait > absl::ZeroDuration()) wake_.WaitWithTimeout(&mu_, wait);
    if (stopping_) return;
  }
}

absl::Duration LeaseKeeper::Tick() {
  absl::Time deadline;
  absl::Time next_renewal;
  absl::Time last_renewed;
  {
    absl::MutexLock lock(&mu_);
    if (!lost_.ok()) return absl::InfiniteDuration();
    deadline = deadline_;
    next_renewal = next_renewal_;
    last_renewed = last_renewed_;
  }
  const auto deadline_passed = [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("lease ", lease_, ": not renewed since ", absl::FormatTime(last_renewed),
                     "; stopped serving at ", absl::FormatTime(deadline), ", ",
                     absl::FormatDuration(safety_margin_), " before its TTL could run out"));
  };
  absl::Time now = clock_.Now();
  if (now >= deadline) {
    Lose(deadline_passed());
    return absl::InfiniteDuration();
  }
  if (now >= next_renewal) {
    const absl::Time sent = now;
    absl::StatusOr<absl::Duration> ttl = etcd_.KeepAliveOnce(lease_);
    now = clock_.Now();
    if (ttl.ok()) {
      absl::MutexLock lock(&mu_);
      last_renewed_ = last_renewed = sent;
      deadline_ = deadline = sent + *ttl - safety_margin_;
      next_renewal_ = next_renewal = sent + renew_every_;
    } else if (absl::IsNotFound(ttl.status())) {
      Lose(ttl.status());
      return absl::InfiniteDuration();
    } else {
      absl::MutexLock lock(&mu_);
      next_renewal_ = next_renewal = now + retry_every_;
    }
    if (now >= deadline) {
      Lose(deadline_passed());
      return absl::InfiniteDuration();
    }
  }
  return std::max(std::min(next_renewal, deadline) - now, absl::ZeroDuration());
}

void LeaseKeeper::Lose(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!lost_.ok()) return;
    lost_ = status;
  }
  if (on_lost_) on_lost_(std::move(status));
}

bool LeaseKeeper::MayServe() const {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  return lost_.ok() && now < deadline_;
}

absl::Time LeaseKeeper::serving_deadline() const {
  absl::MutexLock lock(&mu_);
  return deadline_;
}

absl::Status LeaseKeeper::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

}  // namespace jobbroker::cluster
