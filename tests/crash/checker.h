#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "jobbroker/v1/job.pb.h"

// The crash harness's checker: reads the logs the driver, producers and workers wrote and the
// broker's final state, and decides whether anything acknowledged was lost or undone. Pure: no
// I/O, no clock, no RPC, so tests can feed it crafted logs (checker_test.cc).
//
// Log lines are tab-separated and start with a timestamp in microseconds (line_log.h). Formats:
//
//   producer  <ts> ENQ <job_id> <dedup_key> <kind> <queue> <deduplicated 0|1> <tries> <batch>
//             one line per job of an acknowledged Enqueue (batch 0) or EnqueueBatch (batch n)
//   worker    <ts> START <instance> <pid>
//             <ts> CONNECT <instance> <conn>            subscribe answered OK
//             <ts> DISCONNECT <instance> <conn> <code>  the stream ended
//             <ts> RECV <instance> <job_id> <attempt> <lease_id> <conn>
//             <ts> LOST <instance> <job_id>             the broker said the lease ran out
//             <ts> SKIP <instance> <job_id> <attempt> <lease_id>
//             <ts> ACK_OK <instance> <job_id> <attempt> <lease_id>
//             <ts> ACK_REFUSED <instance> <job_id> <attempt> <lease_id> <code>
//             <ts> FAIL_OK <instance> <job_id> <attempt> <lease_id> <terminal 0|1>
//             <ts> FAIL_REFUSED <instance> <job_id> <attempt> <lease_id> <code>
//             <ts> ANSWER_RETRY <instance> <job_id> <attempt> <lease_id> <code>
//   driver    <ts> SEED <seed>
//             <ts> BROKER_UP <generation> <pid> | BROKER_KILL <generation> <pid>
//             <ts> WORKER_UP|WORKER_KILL|WORKER_STOP|WORKER_CONT <instance> <pid>
//             <ts> PRODUCER_EXIT <name> <code>
//             <ts> SETTLED <0|1>
//   cluster   <ts> FAULT <id> <kind> <target>           a nemesis strikes (tests/cluster/jepsen/);
//                                                       kind and target are opaque words
//             <ts> HEAL <id>                            ... it is over, the cluster whole again
//             <ts> NODE_UP|NODE_KILL|NODE_PAUSE|NODE_CONT <node> <pid>
//             <ts> NODE_STOP|NODE_EXIT <node> <code>    SIGTERMed / exited by itself
//             <ts> NODE_SKEW <node> <seconds>           restarted with its wall clock off
//             <ts> ETCD_KILL <member> <k> | POWER_LOSS <node> 0
//
// The driver stamps a kill after the process is reaped and a stop after the kernel reported it
// stopped, so every line a worker wrote before the event has a smaller timestamp.
//
// The cluster harness adds two kinds of evidence of who wrote each partition's log:
//
//   node log  a node's stderr: JSON lines of server/observability/log.h, flat objects of string
//             values. Only the `partition_role` events count (server/cluster/cluster_mode.cc
//             writes one at every role or epoch change of a partition):
//             {"time":"..","level":"info","event":"partition_role","partition":"4",
//              "node":"node-2","role":"leader","epoch":"16","serving":"true","log_end":"9",
//              "broken":""}
//             Every other event and every line that is not a JSON object are skipped.
//   log dump  tests/cluster/jepsen/log_dump/replica_log_dump's output for one stopped node's
//             data dir, per partition a header, then one line per stored log entry, in seq
//             order (the digest: 16 hex digits, FNV-1a 64 of the entry as the wire encodes it):
//             # partition <p> floor <epoch> base <seq>/<epoch> applied <seq> end <seq>
//             <p>\t<seq>\t<epoch>\t<digest>
namespace jobbroker::crash {

// Payload kinds: what the worker does with the job, hence how it must end.
inline constexpr char kKindOk[] = "ok";            // ack at once            -> COMPLETED
inline constexpr char kKindFlaky[] = "flaky";      // fail attempt 1, then ack -> COMPLETED
inline constexpr char kKindPermanent[] = "perm";   // fail permanently       -> FAILED PERMANENT
inline constexpr char kKindExhaust[] = "exhaust";  // fail every attempt     -> FAILED EXHAUSTED
// Enqueued with a run-time limit; attempt 1 hangs (heartbeated, never answered) until the broker
// ends it TIMED_OUT, then an attempt is acked -> COMPLETED.
inline constexpr char kKindSlow[] = "slow";

struct EnqueueRecord {
  int64_t ts = 0;
  std::string producer;
  std::string job_id;
  std::string dedup_key;
  std::string kind;
  std::string queue;
  bool deduplicated = false;
  int tries = 0;
  int64_t batch = 0;
};

enum class WorkerEventType {
  kStart,
  kConnect,
  kDisconnect,
  kReceived,
  kLeaseLost,
  kSkipped,
  kAckOk,
  kAckRefused,
  kFailOk,
  kFailRefused,
  kAnswerRetry,
};

struct WorkerEvent {
  int64_t ts = 0;
  WorkerEventType type = WorkerEventType::kStart;
  std::string instance;
  std::string job_id;
  std::string lease_id;
  int attempt = 0;
  int64_t conn = 0;
  int code = 0;           // refused / retried answers: the gRPC code
  bool terminal = false;  // FAIL_OK: the fail ended the job (permanent or last attempt)
};

enum class DriverEventType {
  kSeed,
  kBrokerUp,
  kBrokerKill,
  kWorkerUp,
  kWorkerKill,
  kWorkerStop,
  kWorkerCont,
  kProducerExit,
  kSettled,
  // The cluster harness: a fault's start and end, and what the nemeses did to nodes and etcd
  // (facts for the reader: the fault's interval is what explains reruns).
  kFault,
  kHeal,
  kNodeUp,
  kNodeKill,
  kNodePause,
  kNodeCont,
  kNodeStop,
  kNodeExit,
  kNodeSkew,
  kEtcdKill,
  kPowerLoss,
};

struct DriverEvent {
  int64_t ts = 0;
  DriverEventType type = DriverEventType::kSeed;
  std::string subject;  // worker instance, producer name, broker generation, node, fault kind
  std::string target;   // FAULT: what it strikes (a node, an etcd member)
  int64_t value = 0;    // pid, exit code, seed, settled flag, fault id (FAULT and HEAL)
};

// One partition_role event of a node's log.
struct PartitionRoleRecord {
  std::string log;   // the log it came from (ParseNodeLog's `node`)
  std::string time;  // as the node wrote it (its wall clock, which a nemesis may skew)
  std::string node;  // the node that wrote it (its "node" field)
  uint32_t partition = 0;
  std::string role;   // cluster::RoleName: "leader" or "follower"
  int64_t epoch = 0;  // the epoch it leads; 0 for a follower
  bool serving = false;
  uint64_t log_end = 0;
  std::string broken;  // why the replica stopped, empty while it works
};

// A partition's header in a node's log dump: its replica's bounds.
struct ReplicaLogHeader {
  std::string node;
  uint32_t partition = 0;
  int64_t epoch_floor = 0;
  uint64_t base_seq = 0;  // the entry before the first one stored (trimmed, or a snapshot's)
  int64_t base_epoch = 0;
  uint64_t applied_seq = 0;
  uint64_t end_seq = 0;  // the last stored entry (base_seq when none is)
};

// One stored entry of a node's replication log.
struct ReplicaLogEntry {
  std::string node;
  uint32_t partition = 0;
  uint64_t seq = 0;
  int64_t epoch = 0;
  std::string digest;  // of the entry's bytes: equal digests, equal entries
};

// Everything read from the logs of one run.
struct CrashLogs {
  std::vector<EnqueueRecord> enqueues;
  std::vector<WorkerEvent> worker_events;
  std::vector<DriverEvent> driver_events;
  // The cluster harness only: none of these in a crash harness run, whose checks are then
  // exactly the crash harness's.
  std::vector<PartitionRoleRecord> partition_roles;
  std::vector<ReplicaLogHeader> replica_logs;
  std::vector<ReplicaLogEntry> replica_entries;
  // A last line without its newline (the writer was killed inside write): skipped.
  int torn_lines = 0;
  // Complete lines that do not parse: a harness bug, reported as violations.
  std::vector<std::string> malformed;
};

// Each parser appends what `text` holds to `logs`. A HEAL of no earlier FAULT (in `logs`), a
// second HEAL of one fault and a second FAULT of one id are malformed.
void ParseProducerLog(absl::string_view producer, absl::string_view text, CrashLogs& logs);
void ParseWorkerLog(absl::string_view text, CrashLogs& logs);
void ParseDriverLog(absl::string_view text, CrashLogs& logs);
// The cluster harness's evidence (formats above). `node` names the node whose stderr (any of
// its launches: call once per file) or data dir's dump `text` is. A node log's partition_role
// event without a readable partition, node, role or epoch is malformed, and so is any dump line
// that is neither a header nor an entry of the partition of the header before it.
void ParseNodeLog(absl::string_view node, absl::string_view text, CrashLogs& logs);
void ParseReplicaLogDump(absl::string_view node, absl::string_view text, CrashLogs& logs);

enum class ViolationKind {
  kLost,                  // an acknowledged enqueue has no job in the final state
  kWrongFinalState,       // its job ended otherwise than its kind says (or not at all)
  kUnknownJob,            // a job exists or ran that no acknowledged enqueue returned
  kDedupTwoIds,           // one dedup key yielded two job ids
  kSpuriousDedup,         // a first try was answered deduplicated (its key was fresh)
  kUnexplainedDuplicate,  // a job ran again with no kill, stop, crash or intended retry
  kUndoneAck,             // an acknowledged ack (or terminal fail) did not stick, or a job
                          // ran again after the broker recorded an attempt of it completed
  kAttemptReused,         // one attempt number was handed out under two lease ids
  kOverlappingLease,      // an attempt started before the one before it ended
  kMalformedLog,          // a log line the checker cannot read
  // The cluster harness (one writer per epoch, I4 of CLUSTER.md):
  kTwoWritersInEpoch,  // two nodes logged leading a partition in one epoch, or two nodes hold
                       // different entries at one (partition, seq, epoch)
  kLogOrder,           // a node's log of a partition skips or repeats a seq, goes back an
                       // epoch, or does not fit its own header's bounds
  kDependencyOrder,    // a job ran before a job it depends on completed, or that one did not
  // The recurring schedule (kScheduleId):
  kScheduleRunTwice,   // two jobs for one run of it (one run time, one dedup key)
  kScheduleRunMissed,  // two consecutive runs more than its interval apart with the broker up
                       // (no broker kill, cluster fault or node kill in between)
};

const char* ViolationKindName(ViolationKind kind);

struct Violation {
  ViolationKind kind;
  std::string job_id;
  std::string detail;
};

// Why a job ran again: the cause found for each run after the first.
enum class RerunCause {
  kIntendedRetry,  // the previous run failed on purpose (payload kind flaky / exhaust)
  kTimedOut,       // the previous run of a slow job reached its run-time limit (TIMED_OUT)
  kWorkerKill,     // the worker holding the previous run was SIGKILLed before the rerun
  kWorkerStop,     // that worker was SIGSTOPped (its lease ran out) before the rerun
  kBrokerCrash,    // the broker was SIGKILLed between the previous lease and the rerun
  kClusterFault,   // a cluster harness's fault, [FAULT, HEAL], overlapped that window
  kUnexplained,    // none of these: a violation
};

// A recurring schedule the harnesses put before the kills: every second into kScheduledQueue,
// which no worker takes from, so its runs stay READY for the checker (and are left out of the
// jobs the producers' enqueues account for, and of the settle count).
inline constexpr char kScheduleId[] = "crash-every-second";
inline constexpr char kScheduledQueue[] = "crash.scheduled";

struct Summary {
  int64_t jobs_enqueued = 0;    // distinct job ids acknowledged
  int64_t single_enqueues = 0;  // acknowledged Enqueue calls
  int64_t batches = 0;          // acknowledged EnqueueBatch calls
  int64_t jobs_in_batches = 0;
  int64_t jobs_by_kind_ok = 0;
  int64_t jobs_by_kind_flaky = 0;
  int64_t jobs_by_kind_perm = 0;
  int64_t jobs_by_kind_exhaust = 0;
  int64_t jobs_by_kind_slow = 0;
  int64_t enqueues_retried = 0;        // acknowledged only after one or more failed tries
  int64_t dedup_hits_after_crash = 0;  // of those, answered deduplicated (committed before)
  int64_t broker_kills = 0;
  int64_t cluster_faults = 0;           // FAULT lines (the cluster harness's nemeses)
  int64_t cluster_faults_unhealed = 0;  // of those, with no HEAL (the run ended first)
  std::map<std::string, int64_t> faults_by_kind;
  int64_t worker_kills = 0;
  int64_t worker_stops = 0;
  int64_t runs = 0;  // jobs received by workers (distinct leases)
  int64_t jobs_run_more_than_once = 0;
  std::map<RerunCause, int64_t> reruns;
  int64_t attempts_unseen = 0;  // attempts the broker counted that no worker logged
  int64_t attempts_reused = 0;  // an attempt number leased twice (a lease undone by a crash)
  int64_t acks_ok = 0;
  int64_t acks_refused = 0;
  int64_t fails_ok = 0;
  int64_t fails_refused = 0;
  int64_t final_completed = 0;
  int64_t final_failed = 0;
  int64_t final_other = 0;
  int64_t lost = 0;
  int torn_lines = 0;
  // The schedule: its runs in the final state, and gaps between consecutive runs that a kill or
  // fault explains (a run missed for more than a minute is skipped; see docs/workflows.md).
  int64_t dependents = 0;  // jobs that waited for another (depends_on)
  // Dependencies on a job of another queue (another partition with --partitions or a cluster).
  int64_t dependents_across_queues = 0;
  int64_t schedule_runs = 0;
  int64_t schedule_gaps = 0;
  // The cluster harness's writer check.
  int64_t role_records = 0;      // partition_role events read from node logs
  int64_t partitions_led = 0;    // distinct partitions some node logged leading
  int64_t epochs_led = 0;        // distinct (partition, epoch) some node logged leading
  int64_t replica_logs = 0;      // (node, partition) logs dumped
  int64_t replica_entries = 0;   // entries in them
  int64_t entries_compared = 0;  // distinct (partition, seq, epoch) held by two nodes or more
};

struct Report {
  Summary summary;
  std::vector<Violation> violations;

  bool ok() const { return violations.empty(); }
  // The summary as an aligned two-column table, one figure a line; `extra` rows go last.
  std::string SummaryTable(
      const std::vector<std::pair<std::string, std::string>>& extra = {}) const;
  // One line per violation: "<kind> job=<id>: <detail>".
  std::string ViolationList() const;
};

// Checks `logs` against `final_jobs` (every job the broker holds at the end, from the Admin
// API). The jobs of kScheduledQueue are the schedule's runs, checked as such: each run once,
// and a gap between consecutive runs only across a broker kill (1 s either side), a cluster
// fault or a node kill (until 10 s after it healed: a leader moves back to its preferred
// replica some seconds after). An empty kScheduledQueue is no violation (a harness that puts no
// schedule). See README.md for what each check proves. The writer check runs over the node logs and
// dumps in `logs` alone, so it may be run with no final state: Check(logs, {}).
Report Check(const CrashLogs& logs, const std::vector<jobbroker::v1::Job>& final_jobs);

}  // namespace jobbroker::crash
