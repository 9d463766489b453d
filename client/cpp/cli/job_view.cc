#include "client/cpp/cli/job_view.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/cli/format.h"
#include "client/cpp/cli/table.h"
#include "jobbroker/proto_time.h"

namespace jobbroker::cli {
namespace {

constexpr size_t kMaxBytesShown = 200;
constexpr size_t kMaxErrorShown = 80;

}  // namespace

std::string FormatJob(const v1::Job& job, absl::Time now) {
  std::vector<std::pair<std::string, std::string>> fields;
  auto add = [&fields](std::string name, std::string value) {
    fields.emplace_back(std::move(name), std::move(value));
  };
  auto add_if = [&add](std::string name, const std::string& value) {
    if (!value.empty()) add(std::move(name), value);
  };

  std::string state = StateName(job.state());
  if (job.state() == v1::JOB_STATE_FAILED && job.fail_reason() != v1::FAIL_REASON_UNSPECIFIED) {
    absl::StrAppend(&state, " (", FailReasonName(job.fail_reason()), ")");
  }
  if (job.cancel_requested()) absl::StrAppend(&state, ", cancel requested");
  add("id", job.id());
  add("queue", job.queue());
  add("state", state);
  add("attempt", absl::StrCat(job.attempt(), " of ", job.max_attempts()));
  add("priority", absl::StrCat(job.priority()));
  add_if("dedup key", job.dedup_key());
  add_if("concurrency key", job.concurrency_key());
  add_if("idempotency key", job.idempotency_key());
  for (const auto& [key, value] : job.headers()) {
    add("header", absl::StrCat(key, "=", OneLine(value, kMaxBytesShown)));
  }
  add("payload", Printable(job.payload(), kMaxBytesShown));
  add("created", FormatTime(job.created_at(), now));
  // A ready job's run_at is past and says nothing; a scheduled job's is when it becomes ready.
  if (job.state() == v1::JOB_STATE_SCHEDULED) add("run at", FormatTime(job.run_at(), now));
  if (job.state() == v1::JOB_STATE_ACTIVE) {
    add("lease deadline", FormatTime(job.lease_deadline(), now));
    if (client::IsSet(job.timeout_at())) add("times out", FormatTime(job.timeout_at(), now));
  }
  if (job.has_timeout())
    add("timeout", absl::FormatDuration(client::FromProtoDuration(job.timeout())));
  if (client::IsSet(job.expire_at())) add("expires", FormatTime(job.expire_at(), now));
  if (job.snoozes() > 0) add("snoozes", absl::StrCat(job.snoozes()));
  for (const std::string& dep : job.depends_on()) {
    auto result = job.dependency_results().find(dep);
    add("waits for", result == job.dependency_results().end()
                         ? dep
                         : absl::StrCat(dep, " (result ", Printable(result->second, 40), ")"));
  }
  for (const std::string& dependent : job.dependents()) add("needed by", dependent);
  if (!job.progress().empty()) add("progress", Printable(job.progress(), kMaxBytesShown));
  if (client::IsSet(job.completed_at())) add("ended", FormatTime(job.completed_at(), now));
  add_if("last error", OneLine(job.last_error(), kMaxBytesShown * 2));
  if (!job.result().empty()) add("result", Printable(job.result(), kMaxBytesShown));
  if (!job.checkpoint().empty()) add("checkpoint", Printable(job.checkpoint(), kMaxBytesShown));

  size_t width = 0;
  for (const auto& [name, value] : fields) width = std::max(width, name.size());
  std::string out;
  for (const auto& [name, value] : fields) {
    absl::StrAppend(&out, name, ":", std::string(width + 2 - name.size(), ' '), value, "\n");
  }

  if (job.attempts().empty()) {
    absl::StrAppend(&out, "\nattempts: none yet\n");
    return out;
  }
  Table attempts({"#", "WORKER", "STARTED", "ENDED", "OUTCOME", "ERROR"});
  attempts.AlignRight(0);
  for (const v1::AttemptRecord& a : job.attempts()) {
    attempts.AddRow({absl::StrCat(a.attempt()), a.worker_id(), FormatRelative(a.started_at(), now),
                     FormatRelative(a.ended_at(), now), OutcomeName(a.outcome()),
                     OneLine(a.error(), kMaxErrorShown)});
  }
  absl::StrAppend(&out, "\nattempts:\n", attempts.Render());
  return out;
}

}  // namespace jobbroker::cli
