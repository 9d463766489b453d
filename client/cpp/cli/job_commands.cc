// enqueue, get, list, cancel, retry, delete: the commands about jobs.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/cli/commands.h"
#include "client/cpp/cli/format.h"
#include "client/cpp/cli/job_view.h"
#include "client/cpp/cli/table.h"
#include "jobbroker/proto_time.h"

namespace jobbroker::cli {
namespace {

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kDefaultListLimit = 100;
// The broker's largest page.
constexpr int64_t kMaxPageSize = 1000;
constexpr size_t kMaxErrorInList = 50;
// RetryJobRequest.limit of 0.
constexpr int64_t kDefaultRetryLimit = 1000;

std::string ReadAll(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The payload: the argument, --file, or stdin (see the command's details).
absl::StatusOr<std::string> ReadPayload(const CommandContext& ctx) {
  const std::vector<std::string>& pos = ctx.args.positional;
  const std::optional<std::string> file = ctx.args.Get("--file");
  if (file.has_value()) {
    if (pos.size() > 1) {
      return absl::InvalidArgumentError("give the payload as PAYLOAD or with --file, not both");
    }
    std::ifstream in(*file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--file: cannot open ", *file, ": ", std::strerror(errno)));
    }
    std::string payload = ReadAll(in);
    if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("--file: cannot read ", *file));
    return payload;
  }
  if (pos.size() > 1 && pos[1] != "-") return pos[1];
  // An absent PAYLOAD on a terminal means an empty payload, rather than waiting for typing.
  if (pos.size() > 1 || !ctx.io.in_is_terminal) return ReadAll(ctx.io.in);
  return std::string();
}

// EnqueueOptions from the flags; INVALID_ARGUMENT naming the bad one.
absl::StatusOr<client::EnqueueOptions> ParseEnqueueOptions(const ParsedArgs& args) {
  client::EnqueueOptions options;
  for (const std::string& header : args.GetAll("--header")) {
    const size_t eq = header.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--header: \"", header, "\" is not KEY=VALUE"));
    }
    options.headers[header.substr(0, eq)] = header.substr(eq + 1);
  }
  if (auto v = args.Get("--priority")) {
    absl::StatusOr<int64_t> n = ParseIntValue("--priority", *v, kInt32Min, kInt32Max);
    if (!n.ok()) return n.status();
    options.priority = static_cast<int32_t>(*n);
  }
  if (args.Has("--delay") && args.Has("--run-at")) {
    return absl::InvalidArgumentError("give --delay or --run-at, not both");
  }
  if (auto v = args.Get("--delay")) {
    absl::StatusOr<absl::Duration> d = ParseDurationValue("--delay", *v);
    if (!d.ok()) return d.status();
    options.delay = *d;
  }
  if (auto v = args.Get("--run-at")) {
    absl::StatusOr<absl::Time> t = ParseTimeValue("--run-at", *v);
    if (!t.ok()) return t.status();
    options.run_at = *t;
  }
  options.dedup_key = args.Get("--dedup-key").value_or("");
  if (auto v = args.Get("--dedup-ttl")) {
    absl::StatusOr<absl::Duration> d = ParseDurationValue("--dedup-ttl", *v);
    if (!d.ok()) return d.status();
    options.dedup_ttl = *d;
  }
  if (auto v = args.Get("--max-attempts")) {
    // The broker checks the range that makes sense; here only that it is a number.
    absl::StatusOr<int64_t> n = ParseIntValue("--max-attempts", *v, kInt32Min, kInt32Max);
    if (!n.ok()) return n.status();
    options.max_attempts = static_cast<int>(*n);
  }
  if (auto v = args.Get("--lease-duration")) {
    absl::StatusOr<absl::Duration> d = ParseDurationValue("--lease-duration", *v);
    if (!d.ok()) return d.status();
    options.lease_duration = *d;
  }
  options.concurrency_key = args.Get("--concurrency-key").value_or("");
  if (auto v = args.Get("--timeout")) {
    absl::StatusOr<absl::Duration> d = ParseDurationValue("--timeout", *v);
    if (!d.ok()) return d.status();
    options.timeout = *d;
  }
  if (args.Has("--expire-at") && args.Has("--expire-in")) {
    return absl::InvalidArgumentError("give --expire-at or --expire-in, not both");
  }
  if (auto v = args.Get("--expire-at")) {
    absl::StatusOr<absl::Time> t = ParseTimeValue("--expire-at", *v);
    if (!t.ok()) return t.status();
    options.expire_at = *t;
  }
  if (auto v = args.Get("--expire-in")) {
    absl::StatusOr<absl::Duration> d = ParseDurationValue("--expire-in", *v);
    if (!d.ok()) return d.status();
    options.expire_at = absl::Now() + *d;
  }
  options.depends_on = args.GetAll("--after");
  return options;
}

// One line per change a watch shows: when, the state, the attempt and the progress.
std::string ChangeLine(const v1::Job& job) {
  std::string line = absl::StrCat(absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::UTCTimeZone()),
                                  "  ", StateName(job.state()));
  if (job.state() == v1::JOB_STATE_FAILED && job.fail_reason() != v1::FAIL_REASON_UNSPECIFIED)
    absl::StrAppend(&line, " (", FailReasonName(job.fail_reason()), ")");
  if (job.attempt() > 0)
    absl::StrAppend(&line, "  attempt ", job.attempt(), "/", job.max_attempts());
  if (!job.progress().empty()) absl::StrAppend(&line, "  progress ", OneLine(job.progress(), 120));
  return line;
}

// Follows `job_id` to its end (watch, enqueue --wait) and exits by how it ended.
int FollowJob(CommandContext& ctx, const std::string& job_id, absl::Duration timeout) {
  absl::StatusOr<v1::Job> ended = ctx.client.WatchJob(job_id, timeout, [&ctx](const v1::Job& job) {
    ctx.io.out << (ctx.json ? ToJson(job) : ChangeLine(job)) << "\n";
    ctx.io.out.flush();
  });
  if (!ended.ok()) return BrokerError(ctx, ended.status());
  if (!ctx.json) ctx.io.out << "\n" << FormatJob(*ended, absl::Now());
  switch (ended->state()) {
    case v1::JOB_STATE_COMPLETED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitJobFailed;
  }
}

absl::StatusOr<absl::Duration> WaitTimeout(const ParsedArgs& args, const char* flag) {
  if (auto v = args.Get(flag)) return ParseDurationValue(flag, *v);
  return absl::InfiniteDuration();
}

}  // namespace

int RunWatch(CommandContext& ctx) {
  absl::StatusOr<absl::Duration> timeout = WaitTimeout(ctx.args, "--timeout");
  if (!timeout.ok()) return UsageError(ctx, std::string(timeout.status().message()));
  return FollowJob(ctx, ctx.args.positional[0], *timeout);
}

int RunEnqueue(CommandContext& ctx) {
  absl::StatusOr<client::EnqueueOptions> options = ParseEnqueueOptions(ctx.args);
  if (!options.ok()) return UsageError(ctx, std::string(options.status().message()));
  absl::StatusOr<std::string> payload = ReadPayload(ctx);
  if (!payload.ok()) return UsageError(ctx, std::string(payload.status().message()));
  absl::StatusOr<absl::Duration> wait_timeout = WaitTimeout(ctx.args, "--wait-timeout");
  if (!wait_timeout.ok()) return UsageError(ctx, std::string(wait_timeout.status().message()));
  if (ctx.args.Has("--wait-timeout") && !ctx.args.Has("--wait"))
    return UsageError(ctx, "--wait-timeout needs --wait");

  absl::StatusOr<client::Enqueued> enqueued =
      ctx.client.Enqueue(ctx.args.positional[0], *payload, *options);
  if (!enqueued.ok()) return BrokerError(ctx, enqueued.status());
  if (ctx.json) {
    v1::EnqueueResponse resp;
    resp.set_job_id(enqueued->job_id);
    resp.set_deduplicated(enqueued->deduplicated);
    ctx.io.out << ToJson(resp) << "\n";
  } else {
    ctx.io.out << enqueued->job_id << (enqueued->deduplicated ? " (deduplicated)" : "") << "\n";
  }
  if (ctx.args.Has("--wait")) return FollowJob(ctx, enqueued->job_id, *wait_timeout);
  return kExitOk;
}

int RunGet(CommandContext& ctx) {
  absl::StatusOr<v1::Job> job = ctx.client.GetJob(ctx.args.positional[0]);
  if (!job.ok()) return BrokerError(ctx, job.status());
  ctx.io.out << (ctx.json ? ToJson(*job) + "\n" : FormatJob(*job, absl::Now()));
  return kExitOk;
}

int RunList(CommandContext& ctx) {
  v1::ListJobsRequest req;
  req.set_queue(ctx.args.positional[0]);
  if (auto v = ctx.args.Get("--state")) {
    absl::StatusOr<v1::JobState> state = ParseState(*v);
    if (!state.ok()) return UsageError(ctx, std::string(state.status().message()));
    req.set_state(*state);
  }
  int64_t limit = kDefaultListLimit;
  if (auto v = ctx.args.Get("--limit")) {
    absl::StatusOr<int64_t> n = ParseIntValue("--limit", *v, 1, kInt32Max);
    if (!n.ok()) return UsageError(ctx, std::string(n.status().message()));
    limit = *n;
  }
  req.set_newest_first(ctx.args.Has("--newest-first"));

  std::vector<v1::Job> jobs;
  bool cut_short = false;
  while (true) {
    req.set_page_size(
        static_cast<int32_t>(std::min(kMaxPageSize, limit - static_cast<int64_t>(jobs.size()))));
    absl::StatusOr<v1::ListJobsResponse> page = ctx.client.ListJobs(req);
    if (!page.ok()) return BrokerError(ctx, page.status());
    for (const v1::Job& job : page->jobs()) {
      if (static_cast<int64_t>(jobs.size()) < limit) jobs.push_back(job);
    }
    if (page->next_page_token().empty()) break;
    if (static_cast<int64_t>(jobs.size()) >= limit) {
      cut_short = true;
      break;
    }
    req.set_page_token(page->next_page_token());
  }

  if (ctx.json) {
    std::vector<std::string> items;
    items.reserve(jobs.size());
    for (const v1::Job& job : jobs) items.push_back(ToJson(job));
    ctx.io.out << "[" << absl::StrJoin(items, ",") << "]\n";
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  Table table({"ID", "STATE", "ATTEMPT", "PRIORITY", "AGE", "LAST ERROR"});
  table.AlignRight(3);
  for (const v1::Job& job : jobs) {
    table.AddRow({job.id(), StateName(job.state()),
                  absl::StrCat(job.attempt(), "/", job.max_attempts()),
                  absl::StrCat(job.priority()),
                  client::IsSet(job.created_at())
                      ? FormatAge(now - client::FromProtoTimestamp(job.created_at()))
                      : "-",
                  OneLine(job.last_error(), kMaxErrorInList)});
  }
  ctx.io.out << table.Render();
  // On stderr, so that the table on stdout stays clean for other tools.
  if (cut_short) ctx.io.err << "(stopped at --limit " << limit << "; there may be more)\n";
  return kExitOk;
}

int RunCancel(CommandContext& ctx) {
  absl::StatusOr<v1::Job> job = ctx.client.CancelJob(ctx.args.positional[0]);
  if (!job.ok()) return BrokerError(ctx, job.status());
  if (ctx.json) {
    ctx.io.out << ToJson(*job) << "\n";
  } else if (job->state() == v1::JOB_STATE_CANCELLED) {
    ctx.io.out << job->id() << " CANCELLED\n";
  } else {
    ctx.io.out << job->id() << " " << StateName(job->state())
               << ": cancel requested; its worker is told to stop\n";
  }
  return kExitOk;
}

int RunRetry(CommandContext& ctx) {
  const std::optional<std::string> queue = ctx.args.Get("--queue");
  const bool has_job = !ctx.args.positional.empty();
  if (has_job == queue.has_value()) {
    return UsageError(
        ctx, has_job ? "give JOB or --queue, not both" : "give the JOB to retry, or --queue QUEUE");
  }
  v1::RetryJobRequest req;
  if (has_job) {
    for (const char* flag : {"--state", "--dry-run", "--limit"}) {
      if (ctx.args.Has(flag)) return UsageError(ctx, absl::StrCat(flag, " needs --queue"));
    }
    req.set_job_id(ctx.args.positional[0]);
  } else {
    req.set_queue(*queue);
    if (auto v = ctx.args.Get("--state")) {
      absl::StatusOr<v1::JobState> state = ParseState(*v);
      if (state.ok() && *state != v1::JOB_STATE_FAILED && *state != v1::JOB_STATE_CANCELLED) {
        state = absl::InvalidArgumentError("--state: only failed or cancelled jobs are retried");
      }
      if (!state.ok()) return UsageError(ctx, std::string(state.status().message()));
      req.set_state(*state);
    }
    req.set_dry_run(ctx.args.Has("--dry-run"));
    if (auto v = ctx.args.Get("--limit")) {
      // The broker checks its maximum; here only that it is a count.
      absl::StatusOr<int64_t> n = ParseIntValue("--limit", *v, 1, kInt32Max);
      if (!n.ok()) return UsageError(ctx, std::string(n.status().message()));
      req.set_limit(static_cast<int32_t>(*n));
    }
  }

  absl::StatusOr<v1::RetryJobResponse> resp = ctx.client.RetryJob(req);
  if (!resp.ok()) return BrokerError(ctx, resp.status());
  if (ctx.json) {
    ctx.io.out << ToJson(*resp) << "\n";
    return kExitOk;
  }
  if (has_job) {
    ctx.io.out << resp->job().id() << " " << StateName(resp->job().state()) << "\n";
    return kExitOk;
  }
  const std::string what = absl::StrCat(
      absl::AsciiStrToLower(
          StateName(req.state() == v1::JOB_STATE_UNSPECIFIED ? v1::JOB_STATE_FAILED : req.state())),
      " job", resp->matched() == 1 ? "" : "s", " of ", req.queue());
  if (req.dry_run()) {
    ctx.io.out << "would retry " << resp->matched() << " " << what
               << " (dry run: nothing changed)\n";
  } else {
    ctx.io.out << "retried " << resp->retried() << " " << what << "\n";
  }
  // The broker stops at the limit (its default when --limit is absent): say there may be more.
  const int64_t limit = req.limit() == 0 ? kDefaultRetryLimit : req.limit();
  if (resp->matched() >= limit) {
    ctx.io.err << "(stopped at the limit of " << limit << "; there may be more: run it again)\n";
  }
  return kExitOk;
}

int RunDelete(CommandContext& ctx) {
  const std::string& id = ctx.args.positional[0];
  absl::Status deleted = ctx.client.DeleteJob(id);
  if (!deleted.ok()) return BrokerError(ctx, deleted);
  ctx.io.out << (ctx.json ? ToJson(v1::DeleteJobResponse()) : id + " deleted") << "\n";
  return kExitOk;
}

}  // namespace jobbroker::cli
