#include "client/cpp/cli/commands.h"

#include <ostream>

#include "absl/strings/str_cat.h"
#include "client/cpp/cli/usage.h"

namespace jobbroker::cli {

const std::vector<FlagSpec>& GlobalFlags() {
  static const auto* const kFlags = new std::vector<FlagSpec>{
      {"--address", "HOST:PORT[,...]",
       "the broker, or nodes of one cluster (default: $JOBBROKER_ADDRESS, else 127.0.0.1:7070)"},
      {"--json", "", "machine-readable output: proto3 JSON"},
      {"--timeout", "DURATION",
       "deadline of each call (default 10s); for enqueue and watch, whose own --timeout means "
       "something else, give it before the command's name"},
      {"--token-file", "FILE",
       "bearer token for a broker with --auth-tokens, read from FILE (default: $JOBBROKER_TOKEN)"},
      {"--tls", "", "connect over TLS, trusting the system's roots (implied by the flags below)"},
      {"--tls-ca", "FILE", "TLS, trusting the CA certificates in FILE (PEM)"},
      {"--tls-cert", "FILE", "mutual TLS: this client's certificate chain (PEM), with --tls-key"},
      {"--tls-key", "FILE", "mutual TLS: its private key (PEM)"},
      {"--tls-server-name", "NAME",
       "TLS: the name the broker's certificate must carry, if not the"
       " address's host"},
      {"--help", "", "show help"},
  };
  return *kFlags;
}

const std::vector<Command>& Commands() {
  static const auto* const kCommands = new std::vector<Command>{
      {
          .name = "enqueue",
          .args_usage = "QUEUE [PAYLOAD]",
          .summary = "add a job; prints its id",
          .details = "The payload is PAYLOAD, or the contents of --file, or stdin when PAYLOAD\n"
                     "is - (or absent and stdin is not a terminal). Prints the job id, with\n"
                     "\"(deduplicated)\" when --dedup-key matched an existing job; with --json\n"
                     "{\"jobId\":...,\"deduplicated\":...}. Unset options take the queue's "
                     "policy.",
          .min_args = 1,
          .max_args = 2,
          .flags =
              {
                  {"--file", "PATH", "read the payload from this file"},
                  {"--header", "K=V", "a header for the worker (repeatable)", true},
                  {"--priority", "N", "higher runs first (default 0)"},
                  {"--delay", "DURATION", "run no earlier than this long from now"},
                  {"--run-at", "TIME", "run no earlier than this RFC 3339 time"},
                  {"--dedup-key", "KEY", "a second enqueue with this key returns this job"},
                  {"--dedup-ttl", "DURATION", "how long the dedup key blocks duplicates"},
                  {"--max-attempts", "N", "attempts in total, the first included"},
                  {"--lease-duration", "DURATION", "lease length when the worker names none"},
                  {"--concurrency-key", "KEY", "group for max_concurrency_per_key (a tenant)"},
                  {"--timeout", "DURATION", "run-time limit of each attempt, heartbeats or not"},
                  {"--expire-at", "TIME", "fail the job (EXPIRED) if not started by this time"},
                  {"--expire-in", "DURATION", "fail the job if not started this long from now"},
                  {"--after", "JOB", "wait for this job to complete first (repeatable)", true},
                  {"--wait", "", "follow the job to its end, as watch does (exit 0, 4 or 5)"},
                  {"--wait-timeout", "DURATION", "with --wait: give up waiting after this long"},
              },
          .run = RunEnqueue,
      },
      {
          .name = "watch",
          .args_usage = "JOB",
          .summary = "follow a job to its end: a line per change, then the job",
          .details = "Prints a line each time the job's state, attempt or progress changes,\n"
                     "then the job as get shows it. Exits 0 when it COMPLETED, 4 when it\n"
                     "ended FAILED, 5 when CANCELLED. With --json, each change as one line of\n"
                     "the Job message in proto3 JSON.",
          .min_args = 1,
          .max_args = 1,
          .flags = {{"--timeout", "DURATION", "give up after this long (exit 3); the job goes on"}},
          .run = RunWatch,
      },
      {
          .name = "get",
          .args_usage = "JOB",
          .summary = "show a job: state, attempts, errors, times",
          .details = "With --json, the Job message as proto3 JSON (payload in base64).",
          .min_args = 1,
          .max_args = 1,
          .run = RunGet,
      },
      {
          .name = "list",
          .args_usage = "QUEUE",
          .summary = "list a queue's jobs, oldest first",
          .details = "Columns: id, state, attempt/max attempts, priority, age, last error.\n"
                     "With --json, a JSON array of Job messages.",
          .min_args = 1,
          .max_args = 1,
          .flags =
              {
                  {"--state", "STATE",
                   "only jobs in this state: ready|scheduled|active|completed|failed|cancelled"},
                  {"--limit", "N", "at most this many jobs (default 100)"},
                  {"--newest-first", "", "newest jobs first"},
              },
          .run = RunList,
      },
      {
          .name = "cancel",
          .args_usage = "JOB",
          .summary = "cancel a job (an active job's worker is told to stop)",
          .details = "A ready or scheduled job is cancelled at once. An active one gets\n"
                     "cancel_requested: its worker is told, and the job ends as CANCELLED\n"
                     "unless the worker completes it. With --json, the Job as proto3 JSON.",
          .min_args = 1,
          .max_args = 1,
          .run = RunCancel,
      },
      {
          .name = "retry",
          .args_usage = "JOB | --queue QUEUE",
          .summary = "put a failed or cancelled job (or a queue's) back to ready",
          .details =
              "retry JOB: the job runs again from attempt 1; its error and attempt history\n"
              "are kept. retry --queue QUEUE: every failed job of QUEUE (--state cancelled:\n"
              "every cancelled one), oldest first, up to --limit; --dry-run only counts them.\n"
              "With --json, the RetryJobResponse as proto3 JSON.",
          .min_args = 0,
          .max_args = 1,
          .flags =
              {
                  {"--queue", "QUEUE", "retry this queue's jobs instead of one JOB"},
                  {"--state", "STATE", "with --queue: failed (default) or cancelled"},
                  {"--dry-run", "", "with --queue: count the jobs, change nothing"},
                  {"--limit", "N", "with --queue: at most this many jobs (default 1000)"},
              },
          .run = RunRetry,
      },
      {
          .name = "delete",
          .args_usage = "JOB",
          .summary = "remove a job that is not active",
          .details = "An active job is refused: cancel it first. Its dedup key keeps blocking\n"
                     "duplicates until its TTL ends. With --json, {} (DeleteJobResponse).",
          .min_args = 1,
          .max_args = 1,
          .run = RunDelete,
      },
      {
          .name = "queues",
          .summary = "list queues: jobs by state, oldest ready job, waiting workers",
          .details = "With --json, a JSON array of QueueInfo messages.",
          .run = RunQueues,
      },
      {
          .name = "workers",
          .args_usage = "[QUEUE]",
          .summary = "list connected workers: their queues, streams and the jobs they run",
          .details = "With QUEUE, only the workers that take or run jobs of it. A worker that\n"
                     "went away while holding jobs is listed until their leases end.\n"
                     "With --json, a JSON array of WorkerInfo messages.",
          .max_args = 1,
          .run = RunWorkers,
      },
      {
          .name = "pause",
          .args_usage = "QUEUE",
          .summary = "stop leasing from a queue (enqueues are still accepted)",
          .details = "Persisted, like 'policy set QUEUE {\"paused\":true}'. Active jobs run on.\n"
                     "With --json, the QueueInfo as proto3 JSON.",
          .min_args = 1,
          .max_args = 1,
          .run = RunPause,
      },
      {
          .name = "resume",
          .args_usage = "QUEUE",
          .summary = "lease from a paused queue again",
          .details = "With --json, the QueueInfo as proto3 JSON.",
          .min_args = 1,
          .max_args = 1,
          .run = RunResume,
      },
      {
          .name = "purge",
          .args_usage = "QUEUE",
          .summary = "remove a queue's ended jobs (or those in --state); prints how many",
          .details = "Without --state: completed, failed and cancelled jobs. Ready and scheduled\n"
                     "jobs go only when named; active ones never (cancel them first). With\n"
                     "--json, the PurgeQueueResponse as proto3 JSON.",
          .min_args = 1,
          .max_args = 1,
          .flags = {{"--state", "STATE",
                     "purge jobs in this state (repeatable): "
                     "ready|scheduled|completed|failed|cancelled",
                     true}},
          .run = RunPurge,
      },
      {
          .name = "policy get",
          .args_usage = "QUEUE",
          .summary = "print a queue's effective policy (JSON)",
          .details = "Always proto3 JSON of QueuePolicy, every field set.",
          .min_args = 1,
          .max_args = 1,
          .run = RunPolicyGet,
      },
      {
          .name = "policy set",
          .args_usage = "QUEUE JSON",
          .summary = "change a queue's policy; prints the new effective one",
          .details =
              "JSON holds the QueuePolicy fields to change, e.g. '{\"maxConcurrency\":5}'\n"
              "or '{\"retry\":{\"maxAttempts\":3,\"initialBackoff\":\"2s\"}}'; other fields\n"
              "keep their values. JSON - reads it from stdin. The change is persisted.",
          .min_args = 2,
          .max_args = 2,
          .flags = {{"--reset", "", "drop the queue's earlier run-time changes first"}},
          .run = RunPolicySet,
      },
      {
          .name = "schedules",
          .args_usage = "[QUEUE]",
          .summary = "list recurring schedules: when they run, their next and last runs",
          .details = "With QUEUE, only the schedules that enqueue into it. A schedule whose\n"
                     "last run failed (or that cannot run) is listed with its error below.\n"
                     "With --json, a JSON array of Schedule messages.",
          .max_args = 1,
          .run = RunSchedules,
      },
      {
          .name = "schedule put",
          .args_usage = "ID JSON",
          .summary = "create or replace a recurring schedule",
          .details =
              "JSON is the Schedule, e.g. '{\"cron\":\"0 9 * * MON-FRI\",\"timeZone\":\n"
              "\"Europe/Berlin\",\"template\":{\"queue\":\"reports\",\"payload\":\"...\"}}'\n"
              "or '{\"every\":\"900s\",\"template\":{...}}' (payload is base64, as in\n"
              "proto3 JSON). Each run enqueues the template once, with the dedup key\n"
              "ID@<run time>. Replacing keeps its history. JSON - reads it from stdin.",
          .min_args = 2,
          .max_args = 2,
          .run = RunSchedulePut,
      },
      {
          .name = "schedule get",
          .args_usage = "ID",
          .summary = "print a schedule (JSON)",
          .min_args = 1,
          .max_args = 1,
          .run = RunScheduleGet,
      },
      {
          .name = "schedule delete",
          .args_usage = "ID",
          .summary = "delete a schedule (the jobs it enqueued stay)",
          .min_args = 1,
          .max_args = 1,
          .run = RunScheduleDelete,
      },
      {
          .name = "schedule run",
          .args_usage = "ID",
          .summary = "enqueue one run of a schedule now; prints the job id",
          .details = "Also while the schedule is paused; its next run does not move.",
          .min_args = 1,
          .max_args = 1,
          .run = RunScheduleRun,
      },
      {
          .name = "schedule pause",
          .args_usage = "ID",
          .summary = "stop a schedule's runs until it is resumed",
          .min_args = 1,
          .max_args = 1,
          .run = RunSchedulePause,
      },
      {
          .name = "schedule resume",
          .args_usage = "ID",
          .summary = "resume a paused schedule with its next run after now",
          .details = "Runs that came due while it was paused are not caught up.",
          .min_args = 1,
          .max_args = 1,
          .run = RunScheduleResume,
      },
      {
          .name = "health",
          .summary = "check that the broker is serving (exit 0 and SERVING if so)",
          .run = RunHealth,
      },
      {
          .name = "cluster",
          .summary = "show the cluster: nodes, partitions, their leaders and epochs",
          .details = "Admin.GetCluster as one node sees it: each node (id, address, alive) and\n"
                     "each partition (leader, epoch, replicas, in-sync set; leader - while it\n"
                     "has none). A single broker says so. With --json, the ClusterInfo as\n"
                     "proto3 JSON.",
          .run = RunCluster,
      },
  };
  return *kCommands;
}

int UsageError(const CommandContext& ctx, const std::string& message) {
  ctx.io.err << "error: " << message << "\n" << UsageLine(ctx.command) << "\n";
  return kExitUsage;
}

int BrokerError(const CommandContext& ctx, const absl::Status& status) {
  ctx.io.err << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
             << "\n";
  const bool unreachable = status.code() == absl::StatusCode::kUnavailable ||
                           status.code() == absl::StatusCode::kDeadlineExceeded;
  return unreachable ? kExitUnreachable : kExitRefused;
}

}  // namespace jobbroker::cli
