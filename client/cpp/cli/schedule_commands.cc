// schedules, schedule put|get|delete|run|pause|resume: the commands about recurring schedules.
#include <google/protobuf/util/json_util.h>

#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/cli/commands.h"
#include "client/cpp/cli/format.h"
#include "client/cpp/cli/table.h"

namespace jobbroker::cli {
namespace {

// "cron 0 9 * * MON-FRI Europe/Berlin" or "every 15m".
std::string Timing(const v1::Schedule& s) {
  if (!s.cron().empty())
    return absl::StrCat("cron ", s.cron(), s.time_zone().empty() ? "" : " ", s.time_zone());
  return absl::StrCat("every ", FormatAge(s.every()));
}

std::string Status(const v1::Schedule& s) {
  if (!s.error().empty()) return "error";
  if (s.paused()) return "paused";
  if (!s.has_next_run_at()) return "ended";
  return "active";
}

// Puts `s` and prints it as `put` (or --json).
int PutAndShow(CommandContext& ctx, const v1::Schedule& s) {
  absl::StatusOr<v1::Schedule> put = ctx.client.PutSchedule(s);
  if (!put.ok()) return BrokerError(ctx, put.status());
  if (ctx.json) {
    ctx.io.out << ToJson(*put) << "\n";
  } else {
    ctx.io.out << put->schedule_id() << " " << Status(*put) << ", next run "
               << FormatTime(put->next_run_at(), absl::Now()) << "\n";
  }
  return kExitOk;
}

int SetPaused(CommandContext& ctx, bool paused) {
  absl::StatusOr<v1::Schedule> s = ctx.client.GetSchedule(ctx.args.positional[0]);
  if (!s.ok()) return BrokerError(ctx, s.status());
  s->set_paused(paused);
  return PutAndShow(ctx, *s);
}

}  // namespace

int RunSchedules(CommandContext& ctx) {
  const std::string queue = ctx.args.positional.empty() ? "" : ctx.args.positional[0];
  absl::StatusOr<std::vector<v1::Schedule>> schedules = ctx.client.ListSchedules(queue);
  if (!schedules.ok()) return BrokerError(ctx, schedules.status());
  if (ctx.json) {
    std::vector<std::string> items;
    items.reserve(schedules->size());
    for (const v1::Schedule& s : *schedules) items.push_back(ToJson(s));
    ctx.io.out << "[" << absl::StrJoin(items, ",") << "]\n";
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  Table table({"SCHEDULE", "WHEN", "QUEUE", "STATUS", "NEXT RUN", "LAST RUN", "LAST JOB"});
  for (const v1::Schedule& s : *schedules) {
    table.AddRow({s.schedule_id(), Timing(s), s.template_().queue(), Status(s),
                  FormatRelative(s.next_run_at(), now), FormatRelative(s.last_run_at(), now),
                  s.last_job_id().empty() ? "-" : s.last_job_id()});
  }
  ctx.io.out << table.Render();
  for (const v1::Schedule& s : *schedules) {
    if (!s.error().empty()) ctx.io.out << s.schedule_id() << ": " << s.error() << "\n";
  }
  return kExitOk;
}

int RunSchedulePut(CommandContext& ctx) {
  std::string json = ctx.args.positional[1];
  if (json == "-") {
    json.assign(std::istreambuf_iterator<char>(ctx.io.in), std::istreambuf_iterator<char>());
  }
  v1::Schedule s;
  // Unknown fields are refused: a typo must not silently change nothing.
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &s);
  if (!parsed.ok()) {
    return UsageError(ctx, absl::StrCat("JSON is not a Schedule: ", parsed.message().ToString(),
                                        " (fields are lowerCamelCase, e.g. {\"cron\":\"0 3 * * *\","
                                        "\"template\":{\"queue\":\"reports\"}})"));
  }
  if (!s.schedule_id().empty() && s.schedule_id() != ctx.args.positional[0])
    return UsageError(ctx, absl::StrCat("JSON names schedule ", s.schedule_id(), ", not ",
                                        ctx.args.positional[0]));
  s.set_schedule_id(ctx.args.positional[0]);
  return PutAndShow(ctx, s);
}

int RunScheduleGet(CommandContext& ctx) {
  absl::StatusOr<v1::Schedule> s = ctx.client.GetSchedule(ctx.args.positional[0]);
  if (!s.ok()) return BrokerError(ctx, s.status());
  ctx.io.out << ToJson(*s, /*pretty=*/!ctx.json) << "\n";
  return kExitOk;
}

int RunScheduleDelete(CommandContext& ctx) {
  absl::Status s = ctx.client.DeleteSchedule(ctx.args.positional[0]);
  if (!s.ok()) return BrokerError(ctx, s);
  ctx.io.out << (ctx.json ? "{}" : absl::StrCat(ctx.args.positional[0], " deleted")) << "\n";
  return kExitOk;
}

int RunScheduleRun(CommandContext& ctx) {
  absl::StatusOr<v1::TriggerScheduleResponse> run =
      ctx.client.TriggerSchedule(ctx.args.positional[0]);
  if (!run.ok()) return BrokerError(ctx, run.status());
  if (ctx.json) {
    ctx.io.out << ToJson(*run) << "\n";
  } else {
    ctx.io.out << run->job_id() << (run->deduplicated() ? " (already enqueued this second)" : "")
               << "\n";
  }
  return kExitOk;
}

int RunSchedulePause(CommandContext& ctx) { return SetPaused(ctx, true); }
int RunScheduleResume(CommandContext& ctx) { return SetPaused(ctx, false); }

}  // namespace jobbroker::cli
