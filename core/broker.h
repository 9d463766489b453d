#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/commit_pipeline.h"
#include "core/ids.h"
#include "core/job.h"
#include "core/observer.h"
#include "core/policy.h"
#include "core/requests.h"
#include "core/store.h"
#include "core/stream_sink.h"

namespace jobbroker {

struct BrokerOptions {
  // Policy layers under the run-time changes: the config file's default_policy and its per-queue
  // policies (built-in defaults below both).
  PolicyOverride default_policy;
  std::map<std::string, PolicyOverride> queue_policies;
  // Draws from [0, 1) for retry jitter. Unset: absl::BitGen. Tests pin it.
  std::function<double()> uniform;
  // Called (without the broker's lock) when a deadline earlier than the last Tick() result
  // appeared, so a ticker sleeping until then can wake early. May be unset.
  std::function<void()> wake;
  // Told of every job transition worth counting or logging; borrowed, must outlive the broker.
  // Unset: nobody listens.
  BrokerObserver* observer = nullptr;
  // How the pipeline writes: inline for tests, background (group commit) for the server.
  CommitPipeline::Mode commit_mode = CommitPipeline::Mode::kBackground;
  // At most this much time-driven work (expiries, promotions, removals) per Tick.
  int tick_batch = 1000;
  // After a store failure, how often Tick tries the store again (ResumeWrites). Default 1 s: a
  // try costs one small synced write, and writes come back soon after space is freed.
  absl::Duration store_retry_interval = absl::Seconds(1);
  // How many jobs the broker keeps whole in memory. Beyond it, READY and SCHEDULED jobs whose
  // record is in the store are kept as index entries only (about 90 bytes each instead of about
  // 1 KB) and read back from the store when they are leased or looked at. Default 100,000
  // (about 100 MB); 0 keeps only what is ACTIVE or ended whole.
  int64_t max_hot_jobs = 100'000;
};

template <typename T>
using Done = absl::AnyInvocable<void(T)>;

// Broker owns every job's state machine, the queue indexes, leases, retries, dedup keys and
// policies. Thread-safe: one mutex guards memory; durability happens outside it in the
// CommitPipeline (group commit), and every reply waits until its transition is durable.
// `store` and `clock` are borrowed and must outlive the broker.
//
// Each operation comes in two forms: asynchronous (the `done` callback runs exactly once, on
// some thread, after the change is durable or refused) for the server, and a blocking one for
// tests and tools. Status codes: kInvalidArgument names the bad field; kNotFound for an unknown
// job or queue; kFailedPrecondition for a stale lease or a job in the wrong state;
// kAlreadyExists for a dedup key held with another payload; kResourceExhausted for a full
// queue or an oversized field; kUnavailable while shutting down.
//
// Storage failures: when a store write fails, nobody whose change was in it is told OK, and
// every change is refused from then on (kResourceExhausted when the disk is full, kUnavailable
// for other store errors), while reads keep working. Tick retries the store every
// options.store_retry_interval; once it takes writes again, memory is rebuilt from the store
// (the same recovery as Open) and changes are accepted again. A stored record that does not
// decode is skipped at recovery: GetJob of that job answers kDataLoss.
class Broker {
 public:
  // Recovers every job from `store`, rebuilds the indexes, and turns leases that ran out while
  // the broker was down into failed attempts (LEASE_EXPIRED, with backoff). Records that do not
  // decode are skipped and reported to the observer. kInvalidArgument if a policy in `options`
  // is out of range; the store's error if it cannot be read (kDataLoss, kUnavailable). A failed
  // first write does not fail the open: the broker then starts refusing changes (see above).
  static absl::StatusOr<std::unique_ptr<Broker>> Open(Store& store, const Clock& clock,
                                                      BrokerOptions options);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // All or nothing: either every spec is enqueued (or deduplicated) or none is. A refusal about
  // one job starts with "jobs[i]." when there are several, or when `batch` says the caller
  // sent a batch (the API's EnqueueBatch, even of one job).
  void EnqueueBatch(std::vector<EnqueueSpec> specs,
                    Done<absl::StatusOr<std::vector<EnqueueResult>>> done, bool batch = false);
  // Leases up to spec.max_jobs ready jobs. With `wait` > 0 and none ready, waits for one up to
  // `wait`, then answers with an empty list. Returns a handle for CancelWait (0 if answered).
  uint64_t Lease(LeaseSpec spec, absl::Duration wait,
                 Done<absl::StatusOr<std::vector<LeasedJob>>> done);
  // Ends a waiting Lease early: its `done` gets kCancelled. False if it had already answered.
  bool CancelWait(uint64_t waiter);

  // Work streams. Subscribe registers a stream that the broker pushes jobs to, through `sink`,
  // the moment one is ready in any of its queues and it has fewer than max_in_flight unended
  // jobs; streams and long polls of a queue take turns, one job per turn. Returns the stream's
  // handle. kInvalidArgument names a bad field.
  absl::StatusOr<uint64_t> Subscribe(SubscribeSpec spec, std::shared_ptr<StreamSink> sink);
  // Changes a stream's max_in_flight; 0 drains it (no new jobs). kNotFound for an unknown
  // stream.
  absl::Status SetFlow(uint64_t stream, int max_in_flight);
  // The stream ended: no more pushes. Its leases stay and run out unless acked (DESIGN.md: a
  // broken connection must not duplicate work).
  void Unsubscribe(uint64_t stream);
  void Heartbeat(HeartbeatSpec spec, Done<absl::StatusOr<HeartbeatResult>> done);
  void Ack(AckSpec spec, Done<absl::Status> done);
  // Several acks, each applied as if alone, made durable by one write. The answer lists the
  // status of each (OK or why that ack was not applied); the whole call fails only when an item
  // is malformed (kInvalidArgument naming acks[i]; nothing is applied), for more than
  // kMaxLeaseBatch items, or when the broker refuses writes.
  void AckBatch(std::vector<AckSpec> specs, Done<absl::StatusOr<std::vector<absl::Status>>> done);
  void Fail(FailSpec spec, Done<absl::StatusOr<FailResult>> done);
  void Release(ReleaseSpec spec, Done<absl::Status> done);
  // READY/SCHEDULED: CANCELLED at once. ACTIVE: sets cancel_requested. Terminal:
  // kFailedPrecondition.
  void CancelJob(std::string job_id, Done<absl::StatusOr<Job>> done);
  // Merges `policy` into the queue's run-time override (after dropping it if `reset`), persists
  // it and returns the queue. Creates the queue if new.
  void UpdateQueuePolicy(std::string queue, PolicyOverride policy, bool reset,
                         Done<absl::StatusOr<QueueInfo>> done);

  // Admin: moving jobs by hand, pausing and purging queues. Unknown jobs and queues are kNotFound
  // (unlike UpdateQueuePolicy, none of these creates a queue).
  //
  // A FAILED or CANCELLED job back to READY, due now: attempt counter 0, fail_reason, lease and
  // cancel_requested cleared. last_error, the checkpoint and the attempt history stay; new
  // attempts are appended, numbered from 1 again. A dedup key that was freed meanwhile is held
  // again while the job runs (if no other job took it). kFailedPrecondition names the state of a
  // job that is neither FAILED nor CANCELLED.
  void RetryJob(std::string job_id, Done<absl::StatusOr<Job>> done);
  // Bulk redrive: what RetryJob does, for the jobs of spec.queue in spec.state that had ended
  // when the call started, oldest ended first, at most spec.limit. Runs as batches of at most
  // kRetryBatch jobs, one transition each; the next batch starts once the previous one is
  // durable, so other calls run in between and the redrive goes at the pace of the disk.
  // dry_run counts without changing anything. kInvalidArgument names a bad field. If the broker
  // shuts down or fails to write midway, the error says how many were retried before it.
  void RetryJobs(RetryJobsSpec spec, Done<absl::StatusOr<RetryJobsResult>> done);
  // Removes a job that is not ACTIVE (kFailedPrecondition: cancel it first). Its dedup key stays
  // held until its TTL has passed, as after retention.
  void DeleteJob(std::string job_id, Done<absl::Status> done);
  // Sets the queue's run-time `paused` policy (persisted, as UpdateQueuePolicy with `paused`
  // does) and returns the queue.
  void SetQueuePaused(std::string queue, bool paused, Done<absl::StatusOr<QueueInfo>> done);
  // Removes the queue's jobs in `states` (empty: COMPLETED, FAILED and CANCELLED) that were
  // enqueued before the call started; returns how many. In batches of at most kPurgeBatch
  // removals, one transition each, like RetryJobs. kInvalidArgument (naming `states`) for
  // ACTIVE. Dedup keys stay held until their TTL, as after retention.
  //
  // RetryJobs and PurgeQueue continue from the pipeline's completion callbacks. After Shutdown()
  // they answer kUnavailable at their next batch; Shutdown() then Flush() (what the server does)
  // ends them, and must come before the broker is destroyed while one may be running.
  void PurgeQueue(std::string queue, std::vector<JobState> states,
                  Done<absl::StatusOr<int64_t>> done);
  // Blocking forms of the admin calls above.
  absl::StatusOr<Job> RetryJob(std::string job_id);
  absl::StatusOr<RetryJobsResult> RetryJobs(RetryJobsSpec spec);
  absl::Status DeleteJob(std::string job_id);
  absl::StatusOr<QueueInfo> SetQueuePaused(std::string queue, bool paused);
  absl::StatusOr<int64_t> PurgeQueue(std::string queue, std::vector<JobState> states = {});

  // Blocking forms.
  absl::StatusOr<EnqueueResult> Enqueue(EnqueueSpec spec);
  absl::StatusOr<std::vector<EnqueueResult>> EnqueueBatch(std::vector<EnqueueSpec> specs);
  absl::StatusOr<std::vector<LeasedJob>> Lease(LeaseSpec spec);
  absl::StatusOr<HeartbeatResult> Heartbeat(HeartbeatSpec spec);
  absl::Status Ack(AckSpec spec);
  absl::StatusOr<std::vector<absl::Status>> AckBatch(std::vector<AckSpec> specs);
  absl::StatusOr<FailResult> Fail(FailSpec spec);
  absl::Status Release(ReleaseSpec spec);
  absl::StatusOr<Job> CancelJob(std::string job_id);
  absl::StatusOr<QueueInfo> UpdateQueuePolicy(std::string queue, PolicyOverride policy,
                                              bool reset = false);

  // Reads (no durability wait). GetJob of a job whose stored record was corrupt (skipped at
  // recovery) is kDataLoss; DeleteJob removes such a record.
  absl::StatusOr<Job> GetJob(const std::string& job_id);
  // The queue of a job, without copying the job (authorization asks on every job-scoped call).
  // kNotFound for an unknown (or corrupt) job, kInvalidArgument for a malformed id.
  absl::StatusOr<std::string> JobQueue(const std::string& job_id);
  absl::StatusOr<ListJobsResult> ListJobs(const ListJobsSpec& spec);
  absl::StatusOr<QueueInfo> GetQueue(const std::string& queue);
  std::vector<QueueInfo> ListQueues();

  // Does all time-driven work that is due (lease expiry, delayed and backoff jobs coming due,
  // long-poll time-outs, retention, dedup key expiry) and returns when it next needs to run.
  absl::Time Tick();

  // Stops leasing: waiting Leases answer empty, new mutations get kUnavailable. Reads still work.
  void Shutdown();

  // Waits until everything appended so far is durable.
  absl::Status Flush();

  // After a store failure: tries the store now (Store::Resume). If it takes writes again,
  // rebuilds memory from the store as Open does, so that memory holds exactly what is durable
  // (a failed write may or may not be in it), and accepts changes again; Work streams are ended
  // (kUnavailable: subscribe again) and waiting Leases answer empty, since what they held was
  // rebuilt. OK if changes are accepted (at once when nothing had failed); the store's error
  // if it still fails; kUnavailable while shutting down. Tick calls it when a retry is due.
  absl::Status ResumeWrites();

  // OK while the store takes writes; otherwise the refusal every change gets now.
  absl::Status storage_status() const;
  // Stored records the last recovery skipped because they do not decode (less those deleted).
  int64_t corrupt_records() const;

  // Number of store writes so far (group commit shows as fewer writes than operations).
  uint64_t store_writes() const { return pipeline_.writes(); }

  // Jobs held whole in memory, and READY/SCHEDULED jobs held as index entries only (see
  // BrokerOptions::max_hot_jobs).
  struct MemoryCounts {
    int64_t hot_jobs = 0;
    int64_t cold_jobs = 0;
  };
  MemoryCounts memory_counts() const;

 private:
  struct Consumer;
  struct QueueState;
  struct Effects;
  // Orders jobs by deadline or due time; the seq breaks ties and identifies the job.
  using TimeKey = std::pair<absl::Time, uint64_t>;

  struct Recovered;

  Broker(Store& store, const Clock& clock, BrokerOptions options);
  static BrokerObserver& NoObserver();
  absl::Status Recover();
  // Builds memory from what the store held (`found`; memory must be empty) and turns leases that
  // ran out into failed attempts, into `t`. Returns how many leases expired.
  size_t LoadLocked(Recovered& found, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every consumer: waiting Leases and streams are handed out, to be answered without the
  // lock (shutdown, and the rebuild after a storage failure).
  void DetachConsumersLocked(std::vector<Done<absl::StatusOr<std::vector<LeasedJob>>>>& waiting,
                             std::vector<std::shared_ptr<StreamSink>>& streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets every job, queue, dedup key and consumer, handing waiting Leases and streams out to
  // be answered without the lock.
  void ClearLocked(std::vector<Done<absl::StatusOr<std::vector<LeasedJob>>>>& waiting,
                   std::vector<std::shared_ptr<StreamSink>>& streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls ResumeWrites if the store failed and a retry is due.
  void MaybeResume();
  // What a change gets while the store refuses writes after `cause`.
  static absl::Status StorageRefusal(const absl::Status& cause);
  // What a change whose write failed with `written` gets.
  static absl::Status NotDurable(const absl::Status& written);

  // Commits `t` (under mu_), then runs `fx` and `done` once it is durable.
  uint64_t CommitLocked(Transition t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `t` with the durability `fx` asks for (Effects::Touch).
  uint64_t CommitLocked(Transition t, const Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(uint64_t seq, Effects fx, absl::AnyInvocable<void(absl::Status)> done);
  // Answers long polls and tells streams what `fx` holds, once its transition is `written`.
  static void Deliver(Effects& fx, const absl::Status& written);
  // Why no change can be made now (shutting down, or the store failed), or OK.
  absl::Status RefusalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `done` with `result` once `seq` is durable (or with the write's failure).
  template <typename T>
  void Reply(uint64_t seq, Effects fx, Done<absl::StatusOr<T>> done, absl::StatusOr<T> result);
  // The common shape of a mutating operation.
  template <typename T, typename Op>
  void Run(Done<absl::StatusOr<T>> done, Op op);

  QueueState& Queue(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  QueueState* FindQueue(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  QueuePolicy EffectivePolicy(const std::string& queue, const PolicyOverride& runtime) const;
  // The job `id`, read back from the store if it is cold; nullptr if there is none.
  Job* FindJob(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job whose seq an index holds, read back from the store if it is cold. nullptr only if a
  // cold job's record cannot be read: it is then dropped from the indexes and counted corrupt.
  Job* JobBySeq(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job known to be hot: ACTIVE or ended (never cold), or one just found not to be in cold_.
  Job& HotJob(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return *jobs_by_seq_.at(seq).job; }
  // The state of the job `seq` without reading a cold one back (cold ones are READY or
  // SCHEDULED, told apart by the queue's ready index).
  JobState StateOf(const QueueState& q, uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The memory model (docs/architecture.md): hot jobs are whole in memory; cold ones are only
  // in the indexes plus `cold_` (seq -> packed id), their record in the store.
  // Takes a hot job in, with what the store is known to hold of it (`put_at` 0: already there).
  void AdoptLocked(std::unique_ptr<Job> job, uint64_t put_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs a transition puts (seq, state), in order, and noting them once it has a commit
  // number: their record is in the store once that commit is written.
  using PutList = absl::InlinedVector<std::pair<uint64_t, JobState>, 8>;
  static PutList PutsOf(const Transition& t);
  void StampPutsLocked(const PutList& puts, uint64_t commit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes written READY/SCHEDULED jobs cold, oldest put first, while more than max_hot_jobs are
  // hot. Runs at the start of an operation, when no caller holds a Job reference.
  void FreezeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the cold job `seq` back; on failure drops it as DropUnreadable does.
  Job* ThawLocked(uint64_t seq, PackedJobId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cold job whose record cannot be read: out of every index (found by a scan: this is rare),
  // counted corrupt, and reported, so that the rest can be served.
  void DropUnreadable(uint64_t seq, const std::string& id, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Index maintenance: every change of a job's state, run_at or lease goes through these.
  void Index(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job just finished into `finished`: make sure the ticker runs the retention sweep in time.
  void WakeForRetention(const absl::btree_set<TimeKey>& finished, const ::jobbroker::Retention& r,
                        absl::Time ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unindex(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveJob(Job& job, Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Lease expiry and due scheduled jobs (bounded by tick_batch). Runs before every operation so
  // each sees a consistent present.
  void ProcessDue(absl::Time now, Transition& t, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLease(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed attempt (error or lease expiry): schedule a retry or end the job.
  void EndAttemptFailed(Job& job, absl::Time now, AttemptOutcome outcome, std::string error,
                        std::optional<absl::Duration> retry_after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAttemptRecord(Job& job, absl::Time now, AttemptOutcome outcome, std::string error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Retention(absl::Time now, Transition& t, int& budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireDedup(absl::Time now, Transition& t, int& budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Whether `q` may lease a job now: not paused, under max_concurrency and the rate limit, and
  // some key with a ready job has room under max_concurrency_per_key.
  bool CanLease(QueueState& q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leases the next job in turn (CanLease must be true); returns it and its seq.
  std::pair<LeasedJob, uint64_t> LeaseNext(QueueState& q, const LeaseSpec& spec, absl::Time now,
                                           Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the rate limit of `q` next lets a waiting consumer have a job; InfiniteFuture if no
  // one waits on it.
  absl::Time RefillTime(const QueueState& q) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tops up the rate-limit token bucket of `q` to `now`.
  void Refill(QueueState& q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a policy change: a fresh token bucket, and keys that now have room back in turn.
  void PolicyChanged(QueueState& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LeasedJob LeaseOne(Job& job, const LeaseSpec& spec, absl::Time now, Transition& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<LeasedJob> LeaseMany(QueueState& q, const LeaseSpec& spec, absl::Time now,
                                   Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands leasable jobs of `q` to its consumers in turn: a long poll takes its jobs and leaves,
  // a stream takes one job and goes to the back while it has a free slot.
  void ServeConsumers(QueueState& q, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a stream with a free slot in line in each of its queues, and serves them.
  void Enlist(Consumer& stream, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` leaves ACTIVE: the stream that holds it (if any) gets its slot back, and is told the
  // lease is lost if `lost`.
  void EndHold(const Job& job, bool lost, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` (unindexed) just left ACTIVE by an ack, fail or release: index and persist it, give its
  // stream its slot back, and hand the queue's freed slot to whoever waits.
  void Settle(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a consumer from its queues' lines.
  void Delist(Consumer& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<std::vector<EnqueueResult>> EnqueueLocked(std::vector<EnqueueSpec>& specs,
                                                           bool name_jobs, absl::Time now,
                                                           Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the attempt `spec` names (Ack and AckBatch).
  absl::Status AckLocked(AckSpec& spec, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `spec` names, if `lease_id` still fences it; kNotFound / kFailedPrecondition if not.
  absl::StatusOr<Job*> LeasedJobFor(const std::string& job_id, const std::string& lease_id,
                                    Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  QueueInfo InfoLocked(QueueState& q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time NextDeadlineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Uniform() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeWake(absl::Time before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Admin helpers (broker_admin.cc).
  struct Batches;
  // Merges `policy` into the queue's run-time override (after dropping it if `reset`), creating
  // the queue if new; kInvalidArgument if the result is out of range.
  absl::StatusOr<QueueInfo> ChangePolicyLocked(const std::string& queue,
                                               const PolicyOverride& policy, bool reset,
                                               absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A FAILED or CANCELLED `job` back to READY (see RetryJob); the caller serves consumers.
  void RetryLocked(Job& job, absl::Time now, Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `batches` one transition at a time until its step says it is done (see RetryJobs).
  void RunBatches(std::shared_ptr<Batches> batches);

  Store& store_;
  const Clock& clock_;
  const BrokerOptions options_;
  BrokerObserver& observer_;  // options_.observer, or one that ignores everything
  CommitPipeline pipeline_;

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // After a store failure: when Tick next tries the store (InfinitePast: not scheduled yet), and
  // whether a ResumeWrites is running.
  absl::Time resume_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
  // Jobs whose stored record does not decode, with why; and corrupt records of every kind.
  absl::flat_hash_map<std::string, absl::Status> corrupt_jobs_ ABSL_GUARDED_BY(mu_);
  int64_t corrupt_records_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_consumer_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time next_wake_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Hot jobs, by id and by seq. `put_at` is the commit that last put the job (0: the store held
  // it before this process touched it) and `put_state` the state it put, so FreezeLocked can
  // tell whether the store holds exactly what memory does.
  struct HotRef {
    Job* job = nullptr;
    uint64_t put_at = 0;
    JobState put_state = JobState::kReady;
  };
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, HotRef> jobs_by_seq_ ABSL_GUARDED_BY(mu_);
  // Cold jobs: seq -> id. Every other fact of them is in the indexes or the store.
  absl::flat_hash_map<uint64_t, PackedJobId> cold_ ABSL_GUARDED_BY(mu_);
  // (commit, seq) of READY/SCHEDULED puts, in commit order: FreezeLocked's candidates. Stale
  // ones (the job changed since, or left) are skipped when met.
  std::deque<std::pair<uint64_t, uint64_t>> freeze_queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<QueueState>> queues_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<TimeKey> scheduled_ ABSL_GUARDED_BY(mu_);  // (run_at, seq)
  absl::btree_set<TimeKey> leases_ ABSL_GUARDED_BY(mu_);     // (lease_deadline, seq)
  absl::flat_hash_map<std::pair<std::string, std::string>, DedupEntry> dedup_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::tuple<absl::Time, std::string, std::string>> dedup_expiry_
      ABSL_GUARDED_BY(mu_);
  // Long polls and Work streams, by handle.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Consumer>> consumers_ ABSL_GUARDED_BY(mu_);
  // Which stream holds an ACTIVE job it was pushed (by job seq).
  absl::flat_hash_map<uint64_t, uint64_t> holders_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<absl::Time, uint64_t>> waiter_deadlines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace jobbroker
