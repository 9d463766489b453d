// Broker: construction and recovery, the one mutation path, and the indexes every change of a
// job goes through. The operations live in broker_*.cc, one file per kind of caller.
#include "core/broker.h"

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/broker_mutation.h"
#include "core/recovered_state.h"
#include "core/status_macros.h"
#include "core/validation.h"

namespace jobbroker::core {

// ---------------------------------------------------------------------------------------------
// Construction and recovery
Broker::Broker(Store& store, const Clock& clock, BrokerOptions options)
    : store_(store),
      clock_(clock),
      options_(std::move(options)),
      observer_(options_.observer != nullptr ? *options_.observer : NoObserver()),
      own_pipeline_(options_.pipeline != nullptr
                        ? nullptr
                        : std::make_unique<CommitPipeline>(
                              store, options_.commit_mode, &clock, options_.observer,
                              // The ticker may sleep until some far deadline: wake it to
                              // schedule the retries.
                              [this](const absl::Status&) {
                                if (options_.wake) options_.wake();
                              })),
      pipeline_(options_.pipeline != nullptr ? *options_.pipeline : *own_pipeline_),
      queues_(options_.default_policy, options_.queue_policies) {
  rebuilt_at_resets_.store(pipeline_.resets());
}

BrokerObserver& Broker::NoObserver() {
  static BrokerObserver* const none = new BrokerObserver();
  return *none;
}

Broker::~Broker() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Broker>> Broker::Open(Store& store, const Clock& clock,
                                                     BrokerOptions options) {
  BROKER_RETURN_IF_ERROR(ValidateStartPolicies(options.default_policy, options.queue_policies));
  std::unique_ptr<Broker> broker(new Broker(store, clock, std::move(options)));
  BROKER_RETURN_IF_ERROR(broker->Recover());
  return broker;
}

absl::Status Broker::Recover() {
  const absl::Time started = clock_.Now();
  observer_.RecoveryStarted(options_.partition);
  // The store's scan (on this thread) and the building of the indexes (on `loader`) run side by
  // side, a chunk of jobs at a time: at millions of jobs each is about half of a restart, and
  // together they use two cores. At most kChunksAhead chunks wait, so memory stays bounded.
  constexpr size_t kChunksAhead = 4;
  ChunkQueue queue(kChunksAhead);
  Loading loading;
  {
    absl::MutexLock lock(&mu_);
    BeginLoadLocked(started);
  }
  std::thread loader([this, &queue, &loading, started] {
    size_t loaded = 0;
    absl::Time reported = started;
    while (std::optional<RecoveredState::Chunk> chunk = queue.Pop()) {
      loaded += chunk->size();
      {
        absl::MutexLock lock(&mu_);
        LoadChunkLocked(*std::move(chunk), loading);
      }
      // A restart over millions of jobs takes seconds: say it is moving (the "recovering" log
      // line), not only when it is done.
      const absl::Time now = clock_.Now();
      if (now - reported >= kRecoveryProgressEvery) {
        observer_.Recovering(options_.partition, loaded, now - started);
        reported = now;
      }
    }
  });
  RecoveredState found(options_.max_hot_jobs, options_.recovery_chunk_jobs,
                       [&queue](RecoveredState::Chunk chunk) { queue.Push(std::move(chunk)); });
  const absl::Status scanned = store_.Recover(options_.partition, found);
  found.Finish();
  queue.Close();
  loader.join();
  if (!scanned.ok()) {
    observer_.RecoveryFailed(options_.partition, scanned);
    return scanned;
  }
  uint64_t commit;
  size_t expired;
  {
    absl::MutexLock lock(&mu_);
    Transition t;
    Effects fx;                     // nobody is subscribed yet: nothing to deliver
    fx.Require(Durability::kSync);  // waited for below
    expired = FinishLoadLocked(found, loading, clock_.Now(), t, fx);
    commit = CommitChangeLocked(std::move(t), fx);
  }
  // A failed write does not stop the start: the broker serves reads and refuses changes until
  // the store takes writes again (Tick retries it), instead of exiting into a restart loop.
  pipeline_.WaitDurable(commit).IgnoreError();
  observer_.Recovered(options_.partition, found.job_count(), expired, clock_.Now() - started);
  return absl::OkStatus();
}

void Broker::QuarantineLocked(CorruptRecord record) {
  observer_.CorruptRecordSkipped(record);
  jobs_.MarkCorrupt(record.kind, record.key, std::move(record.reason));
}

size_t Broker::LoadLocked(RecoveredState& found, absl::Time now, Transition& t, Effects& fx) {
  BeginLoadLocked(now);
  Loading loading;
  for (RecoveredState::Chunk& chunk : found.chunks) LoadChunkLocked(std::move(chunk), loading);
  found.chunks.clear();
  return FinishLoadLocked(found, loading, now, t, fx);
}

void Broker::BeginLoadLocked(absl::Time now) {
  change_now_ = now;
  queues_.CreateConfigured();
}

void Broker::LoadChunkLocked(RecoveredState::Chunk chunk, Loading& loading) {
  for (auto& [name, policy] : chunk.policies) queues_.SetRuntime(queues_.Get(name), policy);
  // Both are keys of the store or fixed at enqueue; a repeat means a damaged record.
  auto clash = [&](const std::string& id, uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (jobs_.HasId(id)) return absl::DataLossError(absl::StrCat("job ", id, " is stored twice"));
    std::string other = jobs_.IdOfSeq(seq);
    if (other.empty()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("sequence number ", seq, " is also job ", other, "'s"));
  };
  for (Job& job : chunk.jobs) {
    if (absl::Status s = clash(job.id, job.seq); !s.ok()) {
      QuarantineLocked(CorruptRecord{RecordKind::kJob, job.id, std::move(s)});
      continue;
    }
    if (job.state == JobState::kWaiting) loading.waiting.push_back(job.id);
    if (!job.depends_on.empty()) NoteNeededByLocked(job);
    jobs_.SeenSeq(job.seq);
    auto owned = std::make_unique<Job>(std::move(job));
    queues_.Get(owned->queue).all.insert(owned->seq);
    IndexLocked(*owned);
    jobs_.Adopt(std::move(owned), 0);
  }
  // A restart may hold millions of cold jobs, so this loop does no more than their index entries
  // need: one Job is reused, each queue is looked up once, and the id is unpacked only for a
  // clash.
  for (std::string& name : chunk.new_queue_names) {
    loading.queues.push_back(&queues_.Get(name));
    loading.queue_names.push_back(std::move(name));
  }
  Job& fields = loading.fields;
  for (RecoveredState::ColdJob& c : chunk.cold) {
    // An id is a key of the store, so only the seq can repeat (in a damaged record).
    if (jobs_.HasSeq(c.seq)) {
      const std::string id = UnpackJobId(c.id);
      QuarantineLocked(CorruptRecord{RecordKind::kJob, id, clash(id, c.seq)});
      continue;
    }
    jobs_.SeenSeq(c.seq);
    QueueState& q = *loading.queues[c.queue];
    fields.queue = loading.queue_names[c.queue];
    fields.state = c.state;
    fields.seq = c.seq;
    fields.priority = c.priority;
    fields.run_at = c.run_at;
    fields.concurrency_key = std::move(c.concurrency_key);
    fields.expire_at = c.expire_at;
    q.all.insert(c.seq);
    IndexLocked(q, fields);
    jobs_.AddCold(c.seq, c.id);
  }
  for (auto& [id, depends_on] : chunk.cold_depends_on) {
    Job edges;
    edges.id = std::move(id);
    edges.depends_on = std::move(depends_on);
    NoteNeededByLocked(edges);
  }
}

size_t Broker::FinishLoadLocked(RecoveredState& found, Loading& loading, absl::Time now,
                                Transition& t, Effects& fx) {
  for (CorruptRecord& record : found.corrupt) QuarantineLocked(std::move(record));
  applied_seq_ = found.applied_seq;
  // Runs that came due while nobody ran them are enqueued at the next Tick (catch-up rules).
  for (Schedule& s : found.schedules) schedules_.Put(std::move(s));
  for (DedupEntry& e : found.dedup) dedup_.Put(std::move(e));
  change_now_ = now;
  RewaitLocked(loading.waiting, now, t, fx);
  // Leases that ran out while the broker was down become failed attempts now.
  size_t expired = 0;
  while (std::optional<uint64_t> seq = deadlines_.DueLease(now)) {
    ExpireLeaseLocked(jobs_.Hot(*seq), now, t, fx);
    ++expired;
  }
  return expired;
}

// ---------------------------------------------------------------------------------------------
// The one mutation path
absl::Time Broker::StartChangeLocked(Transition& t, Effects& fx) {
  jobs_.Freeze(pipeline_.written(), options_.max_hot_jobs);
  const absl::Time now = clock_.Now();
  change_now_ = now;
  ProcessDueLocked(now, t, fx);
  return now;
}

uint64_t Broker::CommitChangeLocked(Transition t, Effects& fx) {
  ResolveDependentsLocked(t, fx);
  // Noted before Append moves `t`; the commit number is known right after, still under mu_.
  JobTable::PutList puts = JobTable::PutsOf(t);
  // Pushes to workers of a kSync change go out once it is written, while its fsync runs
  // (docs/decisions.md, "early pushes"): the pipeline must then tell written from durable.
  const bool early = fx.level() == Durability::kSync && fx.reaches_workers();
  if (!t.empty()) {
    t.partition = options_.partition;
    t.seq = ++applied_seq_;
  }
  if (!watchers_.empty()) {
    for (const Job& job : t.put_jobs) watchers_.Collect(job, fx.watches);
    for (const std::string& id : t.delete_jobs) watchers_.CollectRemoved(id, fx.watches);
  }
  const uint64_t commit = pipeline_.Append(std::move(t), fx.level(), fx.group_delay, early);
  jobs_.StampPuts(puts, commit);
  if (deadlines_.wake_needed()) fx.wake = true;
  return commit;
}

void Broker::Finish(uint64_t commit, Effects fx, absl::AnyInvocable<void(absl::Status)> done) {
  if (fx.wake && options_.wake) options_.wake();
  for (const std::shared_ptr<StreamCredit>& credit : fx.refills) credit->Refill();
  fx.refills.clear();
  const Durability level = fx.level();
  if (!fx.watches.empty()) {
    // Watchers hear of a change once it is as durable as its caller's answer: what a watcher
    // saw is never taken back by a crash. A failed write tells them nothing (the rebuild that
    // follows ends their watches).
    pipeline_.WhenDurable(
        commit,
        [watches = std::move(fx.watches)](absl::Status written) mutable {
          if (written.ok()) Notify(watches);
        },
        level);
    fx.watches.clear();
  }
  if (level == Durability::kSync && fx.reaches_workers()) {
    // Workers get what the transition handed them once it is in the store's log, while its fsync
    // runs; the caller's answer still waits for the fsync (docs/decisions.md, "early pushes").
    pipeline_.WhenDurable(
        commit, [fx = std::move(fx)](absl::Status written) mutable { Deliver(fx, written); },
        Durability::kGroup);
    if (done) pipeline_.WhenDurable(commit, std::move(done), Durability::kSync);
    return;
  }
  pipeline_.WhenDurable(
      commit,
      [fx = std::move(fx), done = std::move(done)](absl::Status written) mutable {
        Deliver(fx, written);
        if (done) done(std::move(written));
      },
      level);
}

void Broker::Deliver(Effects& fx, const absl::Status& written) {
  for (Effects::Delivery& d : fx.deliveries) {
    if (written.ok()) {
      d.done(std::move(d.jobs));
    } else {
      d.done(NotDurable(written));
    }
  }
  if (!written.ok()) return;  // nothing was leased, lost or cancelled after all
  // Grouped by stream, each in order, so a stream gets what one transition leased to it at once.
  // Streams take turns one job at a time, so the pushes of one stream are rarely adjacent.
  std::vector<std::pair<StreamSink*, std::vector<LeasedJob>>> by_sink;
  for (Effects::Push& p : fx.pushes) {
    auto it = std::find_if(by_sink.begin(), by_sink.end(),
                           [&](const auto& entry) { return entry.first == p.sink.get(); });
    if (it == by_sink.end())
      it = by_sink.emplace(by_sink.end(), p.sink.get(), std::vector<LeasedJob>{});
    it->second.push_back(std::move(p.job));
  }
  for (auto& [sink, jobs] : by_sink) {
    if (jobs.size() == 1) {
      sink->PushJob(std::move(jobs.front()));
    } else {
      sink->PushJobs(std::move(jobs));
    }
  }
  for (Effects::Notice& n : fx.lost) n.sink->LeaseLost(std::move(n.job_id), n.outcome);
  for (Effects::Notice& n : fx.cancelled) n.sink->CancelRequested(std::move(n.job_id));
}

void Broker::Notify(std::vector<WatchNotice>& watches) {
  for (WatchNotice& n : watches) {
    if (n.job.has_value()) n.watcher->Changed(*std::move(n.job));
    if (n.end.has_value()) n.watcher->End(*std::move(n.end));
  }
}

absl::Status Broker::RefusalLocked() const {
  if (shutting_down_) return absl::UnavailableError("the broker is shutting down");
  absl::Status storage = storage_status();
  if (storage.ok() && !WritableLocked()) {
    return absl::UnavailableError(
        absl::StrCat("partition ", options_.partition,
                     " is rebuilding its state after a storage failure; try again"));
  }
  return storage;
}

bool Broker::WritableLocked() const {
  return pipeline_.healthy() && pipeline_.resets() == rebuilt_at_resets_.load();
}

// ---------------------------------------------------------------------------------------------
// Indexes
void Broker::IndexLocked(const Job& job) { IndexLocked(queues_.Get(job.queue), job); }

void Broker::IndexLocked(QueueState& q, const Job& job) {
  q.Index(job);
  switch (job.state) {
    case JobState::kScheduled:
      deadlines_.AddScheduled(job.run_at, job.seq);
      if (job.expire_at != absl::InfiniteFuture()) deadlines_.AddExpiry(job.expire_at, job.seq);
      break;
    case JobState::kActive:
      deadlines_.AddLease(job.active_deadline(), job.seq);
      break;
    case JobState::kCompleted:
    case JobState::kFailed:
    case JobState::kCancelled: {
      // Over the count: the sweep is due now. Under an age limit: when this job gets too old.
      const Retention& r = job.state == JobState::kCompleted ? q.policy.completed_retention
                                                             : q.policy.failed_retention;
      const size_t ended = job.state == JobState::kCompleted ? q.completed.size() : q.dead.size();
      if (r.max_count > 0 && static_cast<int64_t>(ended) > r.max_count)
        deadlines_.Note(job.completed_at);
      if (r.max_age > absl::ZeroDuration()) deadlines_.Note(job.completed_at + r.max_age);
      break;
    }
    case JobState::kReady:
      if (job.expire_at != absl::InfiniteFuture()) deadlines_.AddExpiry(job.expire_at, job.seq);
      break;
    case JobState::kWaiting:
      break;  // its dependencies move it on (broker_dependencies.cc), not time
  }
}

void Broker::UnindexLocked(const Job& job) {
  queues_.Get(job.queue).Unindex(job);
  if (job.state == JobState::kScheduled) deadlines_.RemoveScheduled(job.run_at, job.seq);
  if (job.state == JobState::kReady || job.state == JobState::kScheduled)
    deadlines_.RemoveExpiry(job.expire_at, job.seq);
  if (job.state == JobState::kActive) deadlines_.RemoveLease(job.active_deadline(), job.seq);
}

void Broker::RemoveJobLocked(Job& job, Transition& t) {
  UnindexLocked(job);
  if (!job.depends_on.empty() || needed_by_.contains(job.id)) {
    KeepResultForDependentsLocked(job, t);
    ForgetNeededByLocked(job);
  }
  queues_.Get(job.queue).all.erase(job.seq);
  t.delete_jobs.push_back(job.id);
  // The dedup entry outlives the job until its TTL has passed (ExpireDedupLocked removes it).
  jobs_.Remove(job.seq);  // destroys `job`
}

double Broker::UniformLocked() {
  return options_.uniform ? options_.uniform() : absl::Uniform<double>(gen_, 0.0, 1.0);
}

// ---------------------------------------------------------------------------------------------
// Shutdown
void Broker::DetachConsumersLocked(std::vector<LeaseDone>& waiting,
                                   std::vector<std::shared_ptr<StreamSink>>& streams) {
  consumers_.DetachAll(waiting, streams);
  deadlines_.ClearWaiters();
}

void Broker::Shutdown() {
  std::vector<LeaseDone> waiting;
  std::vector<std::shared_ptr<StreamSink>> streams;
  std::vector<WatchNotice> watches;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    DetachConsumersLocked(waiting, streams);
    for (auto& [name, q] : queues_) q->consumers.clear();
    watchers_.DetachAll(absl::UnavailableError("the broker is shutting down"), watches);
  }
  for (LeaseDone& done : waiting) done(std::vector<LeasedJob>{});
  for (auto& sink : streams) sink->End(absl::UnavailableError("the broker is shutting down"));
  Notify(watches);
}

absl::Status Broker::Flush() {
  uint64_t commit;
  {
    absl::MutexLock lock(&mu_);
    commit = pipeline_.Append(Transition{});
  }
  return pipeline_.WaitDurable(commit);
}

}  // namespace jobbroker::core
