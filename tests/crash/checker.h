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
//
// The driver stamps a kill after the process is reaped and a stop after the kernel reported it
// stopped, so every line a worker wrote before the event has a smaller timestamp.
namespace jobbroker::crash {

// Payload kinds: what the worker does with the job, hence how it must end.
inline constexpr char kKindOk[] = "ok";            // ack at once            -> COMPLETED
inline constexpr char kKindFlaky[] = "flaky";      // fail attempt 1, then ack -> COMPLETED
inline constexpr char kKindPermanent[] = "perm";   // fail permanently       -> FAILED PERMANENT
inline constexpr char kKindExhaust[] = "exhaust";  // fail every attempt     -> FAILED EXHAUSTED

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
};

struct DriverEvent {
  int64_t ts = 0;
  DriverEventType type = DriverEventType::kSeed;
  std::string subject;  // worker instance, producer name, broker generation
  int64_t value = 0;    // pid, exit code, seed, settled flag
};

// Everything read from the logs of one run.
struct CrashLogs {
  std::vector<EnqueueRecord> enqueues;
  std::vector<WorkerEvent> worker_events;
  std::vector<DriverEvent> driver_events;
  // A last line without its newline (the writer was killed inside write): skipped.
  int torn_lines = 0;
  // Complete lines that do not parse: a harness bug, reported as violations.
  std::vector<std::string> malformed;
};

// Each parser appends what `text` holds to `logs`.
void ParseProducerLog(absl::string_view producer, absl::string_view text, CrashLogs& logs);
void ParseWorkerLog(absl::string_view text, CrashLogs& logs);
void ParseDriverLog(absl::string_view text, CrashLogs& logs);

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
  kWorkerKill,     // the worker holding the previous run was SIGKILLed before the rerun
  kWorkerStop,     // that worker was SIGSTOPped (its lease ran out) before the rerun
  kBrokerCrash,    // the broker was SIGKILLed between the previous lease and the rerun
  kUnexplained,    // none of these: a violation
};

struct Summary {
  int64_t jobs_enqueued = 0;    // distinct job ids acknowledged
  int64_t single_enqueues = 0;  // acknowledged Enqueue calls
  int64_t batches = 0;          // acknowledged EnqueueBatch calls
  int64_t jobs_in_batches = 0;
  int64_t jobs_by_kind_ok = 0;
  int64_t jobs_by_kind_flaky = 0;
  int64_t jobs_by_kind_perm = 0;
  int64_t jobs_by_kind_exhaust = 0;
  int64_t enqueues_retried = 0;        // acknowledged only after one or more failed tries
  int64_t dedup_hits_after_crash = 0;  // of those, answered deduplicated (committed before)
  int64_t broker_kills = 0;
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
// API). See README.md for what each check proves.
Report Check(const CrashLogs& logs, const std::vector<jobbroker::v1::Job>& final_jobs);

}  // namespace jobbroker::crash
