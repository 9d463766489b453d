#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/commit_pipeline.h"
#include "core/consumers.h"
#include "core/deadlines.h"
#include "core/dedup_table.h"
#include "core/done.h"
#include "core/effects.h"
#include "core/job.h"
#include "core/job_table.h"
#include "core/observer.h"
#include "core/policy.h"
#include "core/queue_index.h"
#include "core/queue_state.h"
#include "core/recovered_state.h"
#include "core/requests.h"
#include "core/schedule_table.h"
#include "core/store.h"
#include "core/stream_sink.h"
#include "core/watchers.h"
#include "core/workers.h"

namespace jobbroker::core {

// What a read must wait for before it is shown to a client. The broker's reads show memory,
// which holds a change from the moment it is made, before its write ends; a server answers a
// read only once its fence passes, so what a client was shown is never taken back by a crash of
// the process or, in cluster mode, by a failover. Filled by the read that takes it, under the
// broker's lock, so no rebuild of memory can fall between the read and the fence. A read over
// several partitions (ListQueues, ListSchedules) passes one fence to each partition's broker,
// which adds what it must wait for; the fence passes once all of it has.
class ReadFence {
 public:
  // Runs `done` once every change the read could see is in the store's log, as durable as a
  // worker's push (in cluster mode at RF > 1, committed on the partition's in-sync set), with
  // OK. With kUnavailable if this node stopped leading the partition before one of them was
  // committed: the new leader may not have it. A store that fails does not fail the read:
  // reads keep working while writes are refused (docs/durability.md), showing memory as it is.
  // At once, on this thread, when nothing was pending or the read never reached memory (a
  // malformed argument).
  void Await(absl::AnyInvocable<void(absl::Status)> done) const;

 private:
  friend class Broker;
  // The last change a read of one broker could see, in that broker's pipeline.
  struct Pending {
    CommitPipeline* pipeline;
    uint64_t seq;
  };
  absl::InlinedVector<Pending, 1> pending_;  // empty: nothing to wait for
};

struct BrokerOptions {
  // The partition this broker serves (its job ids carry it, its records are keyed by it);
  // node::Partitions runs one broker per partition. Below core::kMaxPartitions.
  uint32_t partition = 0;
  // How many partitions the store (or the cluster) has: a job id whose partition
  // (PartitionOfJobId) is another is a job of another broker, which depends_on may name
  // (RemoteOutcome). 1: every id is this broker's.
  uint32_t partition_count = 1;
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
  // A commit writer shared with other brokers of this process (one per partition, so that they
  // share fsyncs too); borrowed, must outlive the broker, and must write to the same `store`.
  // Unset: the broker makes its own, in commit_mode. A shared pipeline's owner wakes the
  // brokers' tickers on a write failure. The first broker whose ResumeWrites succeeds resets
  // the pipeline; every other broker on it then refuses changes until its own ResumeWrites (its
  // next Tick) has rebuilt its memory from the store, since a failed write may have held some of
  // its changes too (CommitPipeline::resets).
  CommitPipeline* pipeline = nullptr;
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
  // Jobs per chunk of a recovery: the store's scan hands them to the index building a chunk at a
  // time, and progress is reported between chunks. Tests make it small.
  size_t recovery_chunk_jobs = RecoveredState::kDefaultChunkJobs;
};

// Broker owns every job's state machine and the policies around it: retries, leases, dedup keys,
// concurrency and rate limits, retention. Thread-safe: one mutex guards memory; durability
// happens outside it in the CommitPipeline (group commit), and every reply waits until its
// transition is durable. `store` and `clock` are borrowed and must outlive the broker.
//
// The broker is an orchestrator over collaborators that own their state, all guarded by its
// mutex: the JobTable (every job, hot or cold), the QueueIndex (each queue's indexes, policy
// and consumer line), Deadlines (what comes due when), the DedupTable and the Consumers (long
// polls and streams). Every change goes through one mutation path (StartChangeLocked, the
// operation, CommitChangeLocked, then Finish outside the lock), so each sees one present, does
// the due time-driven work first, and is committed at the durability Effects chooses.
//
// Changes are asynchronous: the `done` callback runs exactly once, on some thread, after the
// change is durable or refused (tests/testing/blocking_broker.h waits for it). Status codes:
// kInvalidArgument names the bad field; kNotFound for an unknown job or queue; kFailedPrecondition
// for a stale lease or a job in the wrong state; kAlreadyExists for a dedup key held with another
// payload; kResourceExhausted for a full queue or an oversized field; kUnavailable while shutting
// down.
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
  // A stream with a shared budget (SubscribeSpec::credit) that got credit back: enlists it again
  // in its queues here. What StreamCredit's refill calls; a stream that ended is ignored.
  void RefillStream(uint64_t stream);
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
  // A FAILED or CANCELLED job back to READY, due now: attempt counter 0, fail_reason, lease,
  // cancel_requested, snoozes and expire_at cleared. last_error, the checkpoint and the attempt
  // history stay; new attempts are appended, numbered from 1 again. A dedup key that was freed
  // meanwhile is held again while the job runs (if no other job took it). kFailedPrecondition names
  // the state of a job that is neither FAILED nor CANCELLED.
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
  // Reads, at once: they show changes not yet durable. `fence`, when given, gets what the read
  // must wait for before it is shown (ReadFence). GetJob of a job whose stored record was
  // corrupt (skipped at recovery) is kDataLoss; DeleteJob removes such a record.
  absl::StatusOr<Job> GetJob(const std::string& job_id, ReadFence* fence = nullptr);
  // Admin.WatchJob: `watcher` gets the job as it is now, then the job after each durable change
  // of its state, attempt, progress, snoozes or cancel request, and End(OK) after the change
  // that made it terminal (End(kNotFound) if it is removed, End(kUnavailable) at shutdown).
  // Returns the handle for Unwatch; 0 if the job had already ended (the watcher got it and
  // End(OK) before this returned). kNotFound for an unknown job, kInvalidArgument for a
  // malformed id. A watch costs nothing while its job does not change.
  absl::StatusOr<uint64_t> WatchJob(const std::string& job_id, std::shared_ptr<JobWatcher> watcher);
  // The watcher went away: it is told nothing more (not even End). Unknown handles are ignored.
  void Unwatch(uint64_t handle);
  // Cluster mode, when this node stops leading the partition (node::Partitions::HaltWrites):
  // every watch ends with `why` (kUnavailable: watch again, at the new leader), since the
  // changes it waits for are now made elsewhere; while the pipeline stays halted so, WatchJob
  // refuses with the halt's cause. A watch left here would never hear of its job again.
  void EndWatches(const absl::Status& why);
  // Admin.ListWorkers: every worker with an open stream, a waiting Lease or an ACTIVE job here,
  // by worker_id (core/workers.h). With `queue` set, only those subscribed to, waiting on or
  // running a job of that queue (their other queues and jobs still listed). A read: no change.
  std::vector<WorkerInfo> ListWorkers(const std::string& queue);
  // --- Dependencies on jobs of other partitions (broker_dependencies.cc) -----------------------
  // A job may depend on jobs of other partitions (options.partition_count); this broker cannot
  // see them, so the node's DependencyRelay (server/dependencies) watches them where they live
  // and tells this broker what became of them. The WAITING jobs' depends_on are the durable
  // record of what is awaited: after a restart or a failover the new leader awaits the same ids.
  //
  // The ids of other partitions' jobs that WAITING jobs here still wait for, each once.
  std::vector<std::string> AwaitedRemoteJobs();
  // What became of some of them: each dependent here that still waits is released (with the
  // result) or failed, as for a job of this partition, in one transition. Idempotent: an
  // outcome nobody here waits for any more (applied before, or its dependents ended) changes
  // nothing, so the relay may deliver one twice.
  void SettleRemoteJobs(std::vector<RemoteOutcome> outcomes, Done<absl::Status> done);

  // The queue of a job, without copying the job (authorization asks on every job-scoped call).
  // kNotFound for an unknown (or corrupt) job, kInvalidArgument for a malformed id.
  absl::StatusOr<std::string> JobQueue(const std::string& job_id);
  // Reads, with an optional ReadFence as GetJob.
  absl::StatusOr<ListJobsResult> ListJobs(const ListJobsSpec& spec, ReadFence* fence = nullptr);
  absl::StatusOr<QueueInfo> GetQueue(const std::string& queue, ReadFence* fence = nullptr);
  std::vector<QueueInfo> ListQueues(ReadFence* fence = nullptr);

  // Recurring schedules (broker_schedules.cc): the broker runs those of its own queues. The
  // router sends each to the partition of its template's queue.
  //
  // Creates or replaces `s` (Admin.PutSchedule): kInvalidArgument names a bad field
  // ("schedule.cron: ..."). Its output fields are the broker's: created_at, last_run_at and
  // last_job_id are kept from the schedule it replaces; next_run_at is kept if neither the
  // timing nor `paused` changed, else it is the first run after now. Answers the stored
  // schedule once durable.
  void PutSchedule(Schedule s, Done<absl::StatusOr<ScheduleInfo>> done);
  // kNotFound if there is none, kInvalidArgument for a malformed id. `fence` as GetJob's.
  absl::StatusOr<ScheduleInfo> GetSchedule(const std::string& id, ReadFence* fence = nullptr);
  // Every schedule (with `queue` set, those that enqueue into it), by id. `fence` as GetJob's.
  std::vector<ScheduleInfo> ListSchedules(const std::string& queue, ReadFence* fence = nullptr);
  void DeleteSchedule(std::string id, Done<absl::Status> done);
  // One run now, outside the timing (also while paused): enqueued with the dedup key of `now`
  // (to the second, so a double click is one job); last_run_at and last_job_id say so,
  // next_run_at does not change.
  void TriggerSchedule(std::string id, Done<absl::StatusOr<EnqueueResult>> done);

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

  // The convention, here and in every class of the tree: a method whose name ends in Locked
  // needs the class's mutex held (ABSL_EXCLUSIVE_LOCKS_REQUIRED); every other method takes it
  // itself or needs none. The collaborators are members guarded by mu_, so any call on them
  // needs it too. The clang build of the asan preset checks both.
 private:
  struct Batches;

  Broker(Store& store, const Clock& clock, BrokerOptions options);
  static BrokerObserver& NoObserver();
  absl::Status Recover();

  // --- The one mutation path (broker.cc, broker_mutation.h) -----------------------------------
  // Under mu_, before the operation: makes jobs past max_hot_jobs cold, reads the clock once (the
  // operation sees one present) and does the time-driven work that is due, so that the operation
  // sees a consistent state. Returns `now`.
  absl::Time StartChangeLocked(Transition& t, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_, after it: appends `t` to the pipeline at the durability `fx` chose (Effects has
  // the rules), notes what the store will hold, and whether the ticker must wake. Returns the
  // commit number to wait for.
  uint64_t CommitChangeLocked(Transition t, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refusable change: takes mu_, refuses while shutting down or while the store refuses
  // writes (the refusal, with no commit), else runs `op(now, t, fx) -> absl::Status` between
  // Start and Commit. `fx` and `commit` are for Finish.
  template <typename Op>
  absl::Status Mutate(Effects& fx, uint64_t& commit, Op op) ABSL_LOCKS_EXCLUDED(mu_);
  // Mutate for an operation with an answer: `done` gets `op`'s result once it is durable.
  template <typename T, typename Op>
  void Run(Done<absl::StatusOr<T>> done, Op op) ABSL_LOCKS_EXCLUDED(mu_);
  // Without the lock: carries out `fx` and runs `done` once `commit` is as durable as asked.
  void Finish(uint64_t commit, Effects fx, absl::AnyInvocable<void(absl::Status)> done);
  // Answers `done` with `result` once `commit` is durable (or with the write's failure).
  template <typename T>
  void Reply(uint64_t commit, Effects fx, Done<absl::StatusOr<T>> done, absl::StatusOr<T> result);
  // Answers long polls and tells streams what `fx` holds, once its transition is `written`.
  static void Deliver(Effects& fx, const absl::Status& written);
  // Tells watchers what `watches` holds (without the lock).
  static void Notify(std::vector<WatchNotice>& watches);
  // Why no change can be made now (shutting down, or the store failed), or OK.
  absl::Status RefusalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the pipeline takes writes and this broker's memory matches the store (see
  // rebuilt_at_resets_).
  bool WritableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Recovery and storage failures (broker.cc, broker_storage.cc) ----------------------------
  // What building memory from the store's chunks carries from one chunk to the next.
  struct Loading {
    std::vector<std::string> queue_names;  // of cold jobs, over the chunks so far
    std::vector<QueueState*> queues;       // the same queues, each looked up once
    std::vector<std::string> waiting;      // WAITING jobs, to wait again once all are loaded
    Job fields;  // one cold job's index fields: all IndexLocked reads of a READY/SCHEDULED job
  };
  // Builds memory from what the store held (`found`, finished; memory must be empty) and turns
  // leases that ran out into failed attempts, into `t`. Returns how many leases expired.
  size_t LoadLocked(RecoveredState& found, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LoadLocked in three steps, so that Recover can build one chunk's indexes while the store
  // reads the next: the configured queues first, then each chunk in the store's order, then
  // the rest of `found` (dedup keys, schedules, records that did not decode) and the jobs whose
  // wait or lease is over by `now`.
  void BeginLoadLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoadChunkLocked(RecoveredState::Chunk chunk, Loading& loading)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t FinishLoadLocked(RecoveredState& found, Loading& loading, absl::Time now, Transition& t,
                          Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets every job, queue, dedup key and consumer, handing waiting Leases and streams out to
  // be answered without the lock.
  void ClearLocked(std::vector<LeaseDone>& waiting,
                   std::vector<std::shared_ptr<StreamSink>>& streams,
                   std::vector<WatchNotice>& watches) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls ResumeWrites if the store failed and a retry is due.
  void MaybeResume() ABSL_LOCKS_EXCLUDED(mu_);
  // What a change gets while the store refuses writes after `cause`.
  static absl::Status StorageRefusal(const absl::Status& cause);
  // What a change whose write failed with `written` gets.
  static absl::Status NotDurable(const absl::Status& written);

  // --- Jobs in memory (broker_memory.cc) --------------------------------------------------------
  // The job `id`, read back from the store if it is cold; nullptr if there is none.
  Job* FindJobLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills `fence` (if given) for a read made under this hold of mu_.
  void FenceLocked(ReadFence* fence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job whose seq an index holds, read back from the store if it is cold. nullptr only if a
  // cold job's record cannot be read: it is then dropped from the indexes and counted corrupt.
  Job* JobBySeqLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state of the job `seq` without reading a cold one back (cold ones are READY or
  // SCHEDULED, told apart by the queue's ready index).
  JobState StateOfLocked(const QueueState& q, uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the cold job `seq` back, checking the record against the indexes; on failure drops it
  // as DropUnreadableLocked does.
  Job* ThawLocked(uint64_t seq, PackedJobId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cold job whose record cannot be read: out of every index (found by a scan: this is rare),
  // counted corrupt, and reported, so that the rest can be served.
  void DropUnreadableLocked(uint64_t seq, const std::string& id, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stored record recovery could not use: counted, remembered and reported.
  void QuarantineLocked(CorruptRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Indexes (broker.cc): every change of a job's state, run_at or lease goes through these --
  void IndexLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same, in `q`: job's queue (recovery looks each queue up once, not once per job).
  void IndexLocked(QueueState& q, const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `job` (not ACTIVE) from memory and deletes its record in `t`; destroys `job`.
  void RemoveJobLocked(Job& job, Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Time-driven work (broker_time.cc) --------------------------------------------------------
  // Lease expiry and due scheduled jobs (bounded by tick_batch). Runs before every operation so
  // each sees a consistent present.
  void ProcessDueLocked(absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An ACTIVE job whose lease ran out or whose attempt reached its run-time limit: a failed
  // attempt (kLeaseExpired or kTimedOut), and its stream is told.
  void ExpireLeaseLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A READY or SCHEDULED job whose expire_at passed: FAILED (kExpired).
  void ExpireWaitingLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Long polls whose wait ran out answer empty.
  void TimeOutWaitersLocked(absl::Time now, int& budget, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetentionLocked(absl::Time now, Transition& t, Effects& fx, int& budget)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireDedupLocked(absl::Time now, Transition& t, int& budget)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time NextDeadlineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Attempts ending (broker_attempts.cc) -----------------------------------------------------
  // A failed attempt (error or lease expiry): schedule a retry or end the job.
  void EndAttemptFailedLocked(Job& job, absl::Time now, AttemptOutcome outcome, std::string error,
                              std::optional<absl::Duration> retry_after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishAttemptRecordLocked(Job& job, absl::Time now, AttemptOutcome outcome,
                                 std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `job_id`, if `lease_id` still fences it; kNotFound / kFailedPrecondition if not.
  // Notes that its worker was heard from at `now` (ListWorkers' last_seen).
  absl::StatusOr<Job*> LeasedJobForLocked(const std::string& job_id, const std::string& lease_id,
                                          absl::Time now, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AckLocked(AckSpec& spec, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<FailResult> FailLocked(FailSpec& spec, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<HeartbeatResult> HeartbeatLocked(HeartbeatSpec& spec, absl::Time now,
                                                  Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseLocked(ReleaseSpec& spec, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` (unindexed) just left ACTIVE by an ack, fail or release: index and persist it, give its
  // stream its slot back, and hand the queue's freed slot to whoever waits.
  void SettleLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Handing jobs out (broker_consumers.cc) ---------------------------------------------------
  // Whether `q` may lease a job now: not paused, under max_concurrency and the rate limit, and
  // some key with a ready job has room under max_concurrency_per_key.
  bool CanLeaseLocked(QueueState& q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leases the next job in turn (CanLeaseLocked must be true); returns it and its seq.
  std::pair<LeasedJob, uint64_t> LeaseNextLocked(QueueState& q, const LeaseSpec& spec,
                                                 absl::Time now, Transition& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LeasedJob LeaseOneLocked(QueueState& q, Job& job, const LeaseSpec& spec, absl::Time now,
                           Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<LeasedJob> LeaseManyLocked(QueueState& q, const LeaseSpec& spec, absl::Time now,
                                         Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands leasable jobs of `q` to its consumers in turn: a long poll takes its jobs and leaves,
  // a stream takes one job and goes to the back while it has a free slot.
  void ServeConsumersLocked(QueueState& q, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a stream with a free slot in line in each of its queues, and serves them.
  void EnlistLocked(Consumer& stream, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` leaves ACTIVE: the stream that holds it (if any) gets its slot back, and is told the
  // lease is lost if `lost`.
  void EndHoldLocked(const Job& job, bool lost, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a consumer from its queues' lines (and a long poll from the deadlines).
  void DelistLocked(Consumer& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every consumer (shutdown, and the rebuild after a storage failure).
  void DetachConsumersLocked(std::vector<LeaseDone>& waiting,
                             std::vector<std::shared_ptr<StreamSink>>& streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Enqueue (broker_enqueue.cc) --------------------------------------------------------------
  absl::StatusOr<std::vector<EnqueueResult>> EnqueueLocked(std::vector<EnqueueSpec>& specs,
                                                           bool name_jobs, absl::Time now,
                                                           Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Dependencies (broker_dependencies.cc) ----------------------------------------------------
  // The jobs `spec` (of a batch whose earlier jobs got `earlier`) depends on, as ids, each
  // once. EnqueueLocked has checked that every id is a job of this partition.
  std::vector<std::string> ResolveDependenciesLocked(const EnqueueSpec& spec,
                                                     const std::vector<EnqueueResult>& earlier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new job with dependencies (job.depends_on set, not yet indexed): FAILED at once if one of
  // them failed, WAITING if some have not completed, else as it was (READY or SCHEDULED), with
  // their results.
  void SetDependencyStateLocked(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a change is committed: every job in `t` that ended (or was removed) releases or
  // fails the WAITING jobs that depend on it, and so on down the graph, in `t` too. Nothing to
  // do (and no cost) while no job waits.
  void ResolveDependentsLocked(Transition& t, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A WAITING job whose dependencies all completed: READY (or SCHEDULED), with their results.
  void ReleaseDependentLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A WAITING job whose dependency `dep` ended FAILED or CANCELLED (or was removed): FAILED,
  // kDependencyFailed.
  void FailDependentLocked(Job& job, const std::string& dep, const std::string& why, absl::Time now,
                           Transition& t, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `id` is a job of another partition (options_.partition_count).
  bool IsRemoteJobLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `dep` ended: its dependents that still wait are released (`failed_why` empty; `remote_result`
  // is its result when it is another partition's job, else the result is read from it) or failed
  // with `failed_why`.
  void SettleDependentsLocked(const std::string& dep, const std::string& failed_why,
                              const std::string* remote_result, absl::Time now, Transition& t,
                              Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job::dependents' index (needed_by_): `job` (with depends_on set) is new or recovered, or
  // is being removed.
  void NoteNeededByLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a WAITING job of this partition names `id` in its depends_on (retention then holds
  // `id` back: core/queue_state.h, held_for_dependents).
  bool NeededByWaitingLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` stopped waiting (released or failed): the dependencies retention held back for it go
  // back to retention unless another WAITING job needs them.
  void ReleaseHeldDependenciesLocked(const Job& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `ended` (a dependency that completed) is being removed: the WAITING jobs that hold its
  // result in memory (taken when it completed) store it in `t`, so a restart still has it.
  void KeepResultForDependentsLocked(const Job& ended, Transition& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetNeededByLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovery: the WAITING jobs `ids` wait again for what has not completed.
  void RewaitLocked(const std::vector<std::string>& ids, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Recurring schedules (broker_schedules.cc) ------------------------------------------------
  // Runs every schedule that is due (at most `budget`): its run enqueued and its new next_run_at
  // stored in `t`, together, so that a crash can neither lose the run nor enqueue it twice.
  void RunSchedulesLocked(absl::Time now, Transition& t, Effects& fx, int& budget)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues one run of `s`, the one due at `run`, with its dedup key (schedule::DedupKeyOf).
  absl::StatusOr<EnqueueResult> EnqueueRunLocked(const Schedule& s, absl::Time run, absl::Time now,
                                                 Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ScheduleInfo InfoLocked(const ScheduleTable::Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Operator calls (broker_admin.cc, broker_bulk.cc) -----------------------------------------
  // An operator's change of one job (CancelLocked, RetryOneLocked), given the job. Called with
  // mu_ held; a member pointer cannot carry the annotation, RunOnJob's lambda does.
  using JobChangeLocked = absl::StatusOr<Job> (Broker::*)(Job& job, absl::Time now, Transition& t,
                                                          Effects& fx);
  // Checks `job_id`, then runs `change` on that job through the mutation path at kSync;
  // kNotFound if there is no such job.
  void RunOnJob(std::string job_id, JobChangeLocked change, Done<absl::StatusOr<Job>> done);
  absl::StatusOr<Job> CancelLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job> RetryOneLocked(Job& job, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteLocked(const std::string& job_id, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges `policy` into the queue's run-time override (after dropping it if `reset`), creating
  // the queue if new; kInvalidArgument if the result is out of range.
  absl::StatusOr<QueueInfo> ChangePolicyLocked(const std::string& queue,
                                               const PolicyOverride& policy, bool reset,
                                               absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A FAILED or CANCELLED `job` back to READY (see RetryJob); the caller serves consumers.
  void RetryLocked(Job& job, absl::Time now, Transition& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One batch of a bulk redrive or purge (see RetryJobs, PurgeQueue): true once all is done.
  struct Redrive;
  struct Purge;
  absl::StatusOr<bool> RedriveBatchLocked(Redrive& r, absl::Time now, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<bool> PurgeBatchLocked(Purge& p, Transition& t, Effects& fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `batches` one transition at a time until its step says it is done (see RetryJobs).
  void RunBatches(std::shared_ptr<Batches> batches) ABSL_LOCKS_EXCLUDED(mu_);
  QueueInfo InfoLocked(QueueState& q, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  double UniformLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  Store& store_;
  const Clock& clock_;
  const BrokerOptions options_;
  BrokerObserver& observer_;  // options_.observer, or one that ignores everything
  std::unique_ptr<CommitPipeline> own_pipeline_;  // unless options_.pipeline is shared
  CommitPipeline& pipeline_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  QueueIndex queues_ ABSL_GUARDED_BY(mu_);
  Deadlines deadlines_ ABSL_GUARDED_BY(mu_);
  DedupTable dedup_ ABSL_GUARDED_BY(mu_);
  Consumers consumers_ ABSL_GUARDED_BY(mu_);
  Watchers watchers_ ABSL_GUARDED_BY(mu_);
  RecentWorkers recent_workers_ ABSL_GUARDED_BY(mu_);
  ScheduleTable schedules_ ABSL_GUARDED_BY(mu_);
  // Dependencies (broker_dependencies.cc): for each job some WAITING job waits for, those jobs;
  // and for each WAITING job, how many of its dependencies have not completed. Memory only:
  // rebuilt at recovery from the stored jobs' depends_on and their dependencies' states.
  absl::flat_hash_map<std::string, std::vector<std::string>> dependents_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> waiting_on_ ABSL_GUARDED_BY(mu_);
  // The keys of dependents_ that are jobs of other partitions (AwaitedRemoteJobs).
  absl::flat_hash_set<std::string> remote_awaited_ ABSL_GUARDED_BY(mu_);
  // For each job of this partition that some job here names in depends_on, those jobs, whatever
  // their state (Job::dependents, the dashboard's links down the graph). Memory only: rebuilt at
  // recovery from every stored job's depends_on.
  absl::flat_hash_map<std::string, std::vector<std::string>> needed_by_ ABSL_GUARDED_BY(mu_);
  // The present of the change being made (StartChangeLocked's `now`), for the dependency
  // resolution CommitChangeLocked does.
  absl::Time change_now_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // The partition's last Transition::seq (the store's applied_seq after recovery).
  uint64_t applied_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // pipeline_.resets() when this broker last rebuilt its memory from the store (or opened): if
  // the pipeline was reset since, by another broker sharing it, this one's memory may hold
  // changes that the failed write lost, and it must rebuild before it writes.
  std::atomic<uint64_t> rebuilt_at_resets_{0};
  // pipeline_.last_appended() when this broker last rebuilt its memory from the store: what a
  // read sees was all stored, up to here, or dropped and no longer in memory.
  uint64_t rebuilt_through_ ABSL_GUARDED_BY(mu_) = 0;
  // After a store failure: when Tick next tries the store (InfinitePast: not scheduled yet), and
  // whether a ResumeWrites is running.
  absl::Time resume_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace jobbroker::core
