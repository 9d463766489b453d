#include "server/grpc/dependency_relay.h"

#include <atomic>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/ids.h"
#include "core/watchers.h"
#include "server/observability/log.h"

namespace jobbroker::server {
namespace {

// How long Stop waits for the remote watches to end once cancelled.
constexpr absl::Duration kStopWait = absl::Seconds(5);

// A watched job's end as the waiting partition takes it; nullopt while it has not ended.
std::optional<core::RemoteOutcome> OutcomeOf(const std::string& id, core::JobState state,
                                             const std::string& result) {
  if (!core::IsTerminal(state)) return std::nullopt;
  return core::RemoteOutcome{.job_id = id, .state = state, .result = result};
}

std::optional<core::RemoteOutcome> OutcomeOf(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_COMPLETED:
      return OutcomeOf(job.id(), core::JobState::kCompleted, job.result());
    case v1::JOB_STATE_FAILED:
      return OutcomeOf(job.id(), core::JobState::kFailed, "");
    case v1::JOB_STATE_CANCELLED:
      return OutcomeOf(job.id(), core::JobState::kCancelled, "");
    default:
      return std::nullopt;
  }
}

core::RemoteOutcome Gone(const std::string& id) {
  return core::RemoteOutcome{.job_id = id, .gone = true};
}

}  // namespace

// What the watches tell the relay's thread. A watch's callbacks come from a broker's pipeline
// thread or gRPC's, must not block, and may come after the relay stopped: they only queue here.
struct DependencyRelay::Inbox {
  using Key = std::pair<uint32_t, std::string>;  // (waiting partition, awaited job id)

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Every awaited job with a watch open, or whose outcome is being settled: not watched again.
  absl::flat_hash_set<Key> watched ABSL_GUARDED_BY(mu);
  // Outcomes to settle, by waiting partition.
  absl::flat_hash_map<uint32_t, std::vector<core::RemoteOutcome>> outcomes ABSL_GUARDED_BY(mu);
  // The local watches, to end at Stop: (broker, handle).
  absl::flat_hash_map<Key, std::pair<core::Broker*, uint64_t>> local ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<Key, std::weak_ptr<RemoteWatch>> remote ABSL_GUARDED_BY(mu);
  int remote_open ABSL_GUARDED_BY(mu) = 0;

  void Arrived(const Key& key, core::RemoteOutcome outcome) {
    absl::MutexLock lock(&mu);
    local.erase(key);
    outcomes[key.first].push_back(std::move(outcome));
  }
  // The watch ended without an outcome (its broker stopped leading, a connection broke): it is
  // opened again at the next round if the job is still awaited.
  void Broke(const Key& key) {
    absl::MutexLock lock(&mu);
    local.erase(key);
    watched.erase(key);
  }
};

// A watch in a broker of this node.
class DependencyRelay::LocalWatch final : public core::JobWatcher {
 public:
  LocalWatch(std::shared_ptr<Inbox> inbox, Inbox::Key key)
      : inbox_(std::move(inbox)), key_(std::move(key)) {}

  // Set before the watch tells the inbox, so the relay does not keep its handle once it ended.
  bool ended() const { return ended_.load(); }

  void Changed(core::Job job) override {
    if (ended_.load()) return;
    if (std::optional<core::RemoteOutcome> outcome = OutcomeOf(job.id, job.state, job.result)) {
      ended_.store(true);
      inbox_->Arrived(key_, *std::move(outcome));
    }
  }
  void End(absl::Status status) override {
    if (ended_.exchange(true)) return;
    if (absl::IsNotFound(status)) {
      inbox_->Arrived(key_, Gone(key_.second));
    } else {
      inbox_->Broke(key_);
    }
  }

 private:
  const std::shared_ptr<Inbox> inbox_;
  const Inbox::Key key_;
  // Calls come one at a time (the first under the broker's lock, the rest from its pipeline);
  // the relay's thread reads it.
  std::atomic<bool> ended_{false};
};

// Admin.WatchJob on the node that leads the awaited job's partition.
class DependencyRelay::RemoteWatch final : public grpc::ClientReadReactor<v1::Job> {
 public:
  static void Start(std::shared_ptr<Inbox> inbox, Inbox::Key key, v1::Admin::Stub& stub,
                    std::string address, const std::string& node_id, const std::string& peer_token,
                    absl::Time refresh_at) {
    auto watch =
        std::shared_ptr<RemoteWatch>(new RemoteWatch(inbox, key, std::move(address), refresh_at));
    watch->self_ = watch;
    watch->request_.set_job_id(key.second);
    // Sent on as is: a node answers it or refuses it, never forwards it.
    watch->ctx_.AddMetadata(Router::kForwardedHeader, node_id);
    if (!peer_token.empty()) watch->ctx_.AddMetadata("authorization", "Bearer " + peer_token);
    {
      absl::MutexLock lock(&inbox->mu);
      inbox->remote[key] = watch;
      ++inbox->remote_open;
    }
    stub.async()->WatchJob(&watch->ctx_, &watch->request_, watch.get());
    watch->StartRead(&watch->job_);
    watch->StartCall();
  }

  void Cancel() {
    if (!cancelled_.exchange(true)) ctx_.TryCancel();
  }
  // Cancelled and not yet done: nothing more to do with it.
  bool cancelled() const { return cancelled_.load(); }
  // The node it was opened at.
  const std::string& address() const { return address_; }
  // When it is opened again if nothing ended it.
  absl::Time refresh_at() const { return refresh_at_; }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (!outcome_.has_value()) outcome_ = OutcomeOf(job_);
    StartRead(&job_);
  }
  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&inbox_->mu);
      // Before the key is freed below: a watch opened for it after that is not this one's to
      // forget.
      auto it = inbox_->remote.find(key_);
      if (it != inbox_->remote.end() && it->second.lock().get() == this) inbox_->remote.erase(it);
      --inbox_->remote_open;
    }
    if (outcome_.has_value()) {
      inbox_->Arrived(key_, *std::move(outcome_));
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      inbox_->Arrived(key_, Gone(key_.second));
    } else {
      inbox_->Broke(key_);
    }
    self_.reset();  // may delete this
  }

 private:
  RemoteWatch(std::shared_ptr<Inbox> inbox, Inbox::Key key, std::string address,
              absl::Time refresh_at)
      : inbox_(std::move(inbox)),
        key_(std::move(key)),
        address_(std::move(address)),
        refresh_at_(refresh_at) {}

  const std::shared_ptr<Inbox> inbox_;
  const Inbox::Key key_;
  const std::string address_;
  const absl::Time refresh_at_;
  std::shared_ptr<RemoteWatch> self_;
  grpc::ClientContext ctx_;
  v1::WatchJobRequest request_;
  v1::Job job_;
  std::optional<core::RemoteOutcome> outcome_;
  std::atomic<bool> cancelled_{false};
};

DependencyRelay::DependencyRelay(node::Partitions& partitions, const Router& router,
                                 Forwarder* forwarder, std::string peer_token)
    : partitions_(partitions),
      router_(router),
      forwarder_(forwarder),
      peer_token_(std::move(peer_token)),
      inbox_(std::make_shared<Inbox>()) {}

DependencyRelay::~DependencyRelay() { Stop(); }

void DependencyRelay::Start() {
  // One partition: every dependency is a job of its own.
  if (partitions_.count() < 2 || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void DependencyRelay::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&inbox_->mu);
    inbox_->stopping = true;
  }
  thread_.join();
  std::vector<std::pair<core::Broker*, uint64_t>> local;
  std::vector<std::shared_ptr<RemoteWatch>> remote;
  {
    absl::MutexLock lock(&inbox_->mu);
    for (const auto& [key, watch] : inbox_->local) local.push_back(watch);
    inbox_->local.clear();
    for (const auto& [key, watch] : inbox_->remote)
      if (std::shared_ptr<RemoteWatch> w = watch.lock()) remote.push_back(std::move(w));
  }
  for (const auto& [broker, handle] : local) broker->Unwatch(handle);
  for (const std::shared_ptr<RemoteWatch>& watch : remote) watch->Cancel();
  remote.clear();
  // A client reactor must end before the channel it runs on (the forwarder's) goes.
  absl::MutexLock lock(&inbox_->mu);
  auto ended = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_->mu) { return inbox_->remote_open == 0; };
  inbox_->mu.AwaitWithTimeout(absl::Condition(&ended), kStopWait);
}

void DependencyRelay::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&inbox_->mu);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_->mu) {
        return inbox_->stopping || !inbox_->outcomes.empty();
      };
      inbox_->mu.AwaitWithTimeout(absl::Condition(&due), kRound);
      if (inbox_->stopping) return;
    }
    Round();
  }
}

void DependencyRelay::Round() {
  absl::flat_hash_map<uint32_t, std::vector<core::RemoteOutcome>> outcomes;
  {
    absl::MutexLock lock(&inbox_->mu);
    outcomes.swap(inbox_->outcomes);
  }
  for (auto& [waiting_partition, batch] : outcomes) {
    const uint32_t partition = waiting_partition;  // clang 14 cannot capture a structured binding
    std::vector<Inbox::Key> keys;
    for (const core::RemoteOutcome& o : batch) keys.emplace_back(partition, o.job_id);
    partitions_.broker(partition).SettleRemoteJobs(
        std::move(batch), [inbox = inbox_, keys = std::move(keys), partition](absl::Status s) {
          // Settled: the broker awaits them no more. Refused (this node stopped leading, a
          // write failed): whoever leads next awaits them and watches them again.
          if (!s.ok())
            Log::Write(LogLevel::kWarn, "dependency_settle_failed",
                       {{"partition", absl::StrCat(partition)},
                        {"jobs", absl::StrCat(keys.size())},
                        {"reason", std::string(s.message())}});
          absl::MutexLock lock(&inbox->mu);
          for (const Inbox::Key& key : keys) inbox->watched.erase(key);
        });
  }
  CancelStaleWatches();
  for (uint32_t p = 0; p < partitions_.count(); ++p) {
    if (!router_.ServedHere(p)) continue;
    for (const std::string& id : partitions_.broker(p).AwaitedRemoteJobs()) {
      {
        absl::MutexLock lock(&inbox_->mu);
        if (inbox_->stopping) return;
        if (!inbox_->watched.emplace(p, id).second) continue;
      }
      Watch(p, id);
    }
  }
}

void DependencyRelay::CancelStaleWatches() {
  if (forwarder_ == nullptr) return;  // no remote watches
  std::vector<std::shared_ptr<RemoteWatch>> stale;
  const absl::Time now = absl::Now();
  // Routed once per partition, not once per awaited job under the inbox's lock.
  std::vector<Route> routes(partitions_.count());
  for (uint32_t p = 0; p < routes.size(); ++p) routes[p] = router_.RouteOf(p, /*forwarded=*/false);
  {
    absl::MutexLock lock(&inbox_->mu);
    for (const auto& [key, weak] : inbox_->remote) {
      std::shared_ptr<RemoteWatch> watch = weak.lock();
      if (watch == nullptr || watch->cancelled()) continue;
      const uint32_t where = core::PartitionOfJobId(key.second, partitions_.count()).value_or(0);
      const Route& route = routes[where];
      // No leader now (an election): the watch is kept; it may be at the next leader.
      const bool moved = route.kind == Route::Kind::kLocal ||
                         (route.kind == Route::Kind::kForward && route.address != watch->address());
      if (!moved && watch->refresh_at() > now) continue;
      // A move is rare (a leader changed while a job waited) and says where a stuck dependent
      // was looked for; a refresh is routine.
      if (moved)
        Log::Write(LogLevel::kInfo, "dependency_watch_moved",
                   {{"partition", absl::StrCat(key.first)},
                    {"awaits", key.second},
                    {"from", watch->address()},
                    {"to", route.kind == Route::Kind::kLocal ? router_.node_id() : route.address}});
      stale.push_back(std::move(watch));
    }
  }
  // Each ends through OnDone (CANCELLED, or the outcome it read first), which frees its key.
  for (const std::shared_ptr<RemoteWatch>& watch : stale) watch->Cancel();
}

void DependencyRelay::Watch(uint32_t waiting_partition, const std::string& job_id) {
  const Inbox::Key key(waiting_partition, job_id);
  const uint32_t where = core::PartitionOfJobId(job_id, partitions_.count()).value_or(0);
  const Route route = router_.cluster_mode() ? router_.RouteOf(where, /*forwarded=*/false)
                                             : Route{.kind = Route::Kind::kLocal};
  if (route.kind == Route::Kind::kForward && forwarder_ != nullptr) {
    // Spread over a second kRefreshAfter, so that the watches opened in one round (a failover
    // reopens them all) are not all opened again in one later round.
    const absl::Time refresh_at =
        absl::Now() + kRefreshAfter * (1 + absl::Uniform<double>(gen_, 0.0, 1.0));
    RemoteWatch::Start(inbox_, key, forwarder_->AdminAt(route.address), route.address,
                       router_.node_id(), peer_token_, refresh_at);
    return;
  }
  if (route.kind != Route::Kind::kLocal) return inbox_->Broke(key);  // no leader now
  core::Broker& broker = partitions_.broker(where);
  auto watch = std::make_shared<LocalWatch>(inbox_, key);
  absl::StatusOr<uint64_t> handle = broker.WatchJob(job_id, watch);
  if (absl::IsNotFound(handle.status())) return inbox_->Arrived(key, Gone(job_id));
  if (!handle.ok()) return inbox_->Broke(key);
  absl::MutexLock lock(&inbox_->mu);
  // Kept for Stop while it runs; one that ended already (it told the inbox) has nothing to end.
  if (*handle != 0 && !watch->ended()) inbox_->local[key] = {&broker, *handle};
}

}  // namespace jobbroker::server
