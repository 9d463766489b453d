// queues, pause, resume, purge, policy get, policy set, health, cluster: the commands about
// queues and the broker.
#include <google/protobuf/util/json_util.h>

#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/cli/cluster_view.h"
#include "client/cpp/cli/commands.h"
#include "client/cpp/cli/format.h"
#include "client/cpp/cli/table.h"

namespace jobbroker::cli {
namespace {

int64_t Count(const v1::QueueInfo& info, v1::JobState state) {
  auto it = info.counts().find(v1::JobState_Name(state));
  return it == info.counts().end() ? 0 : it->second;
}

}  // namespace

int RunQueues(CommandContext& ctx) {
  absl::StatusOr<std::vector<v1::QueueInfo>> queues = ctx.client.ListQueues();
  if (!queues.ok()) return BrokerError(ctx, queues.status());
  if (ctx.json) {
    std::vector<std::string> items;
    items.reserve(queues->size());
    for (const v1::QueueInfo& info : *queues) items.push_back(ToJson(info));
    ctx.io.out << "[" << absl::StrJoin(items, ",") << "]\n";
    return kExitOk;
  }
  // WAITING: jobs whose dependencies have not all completed (depends_on).
  Table table({"QUEUE", "WAITING", "READY", "SCHEDULED", "ACTIVE", "COMPLETED", "FAILED",
               "CANCELLED", "OLDEST READY", "WAITING WORKERS"});
  for (size_t c = 1; c < 10; ++c) table.AlignRight(c);
  for (const v1::QueueInfo& info : *queues) {
    table.AddRow({info.name(), absl::StrCat(Count(info, v1::JOB_STATE_WAITING)),
                  absl::StrCat(Count(info, v1::JOB_STATE_READY)),
                  absl::StrCat(Count(info, v1::JOB_STATE_SCHEDULED)),
                  absl::StrCat(Count(info, v1::JOB_STATE_ACTIVE)),
                  absl::StrCat(Count(info, v1::JOB_STATE_COMPLETED)),
                  absl::StrCat(Count(info, v1::JOB_STATE_FAILED)),
                  absl::StrCat(Count(info, v1::JOB_STATE_CANCELLED)),
                  FormatAge(info.oldest_ready_age()), absl::StrCat(info.waiting_leases())});
  }
  ctx.io.out << table.Render();
  return kExitOk;
}

int RunWorkers(CommandContext& ctx) {
  const std::string queue = ctx.args.positional.empty() ? "" : ctx.args.positional[0];
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ctx.client.ListWorkers(queue);
  if (!workers.ok()) return BrokerError(ctx, workers.status());
  if (ctx.json) {
    std::vector<std::string> items;
    items.reserve(workers->size());
    for (const v1::WorkerInfo& w : *workers) items.push_back(ToJson(w));
    ctx.io.out << "[" << absl::StrJoin(items, ",") << "]\n";
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  Table table({"WORKER", "QUEUES", "STREAMS", "RUNNING", "CONNECTED", "JOBS"});
  for (size_t c = 2; c < 4; ++c) table.AlignRight(c);
  for (const v1::WorkerInfo& w : *workers) {
    std::vector<std::string> jobs;
    for (const v1::RunningJob& r : w.running()) jobs.push_back(r.job_id());
    table.AddRow({w.worker_id(), absl::StrJoin(w.queues(), ","),
                  absl::StrCat(w.streams() + w.lease_waits()),
                  w.max_in_flight() > 0 ? absl::StrCat(w.running_size(), "/", w.max_in_flight())
                                        : absl::StrCat(w.running_size()),
                  FormatRelative(w.connected_at(), now), OneLine(absl::StrJoin(jobs, ","), 80)});
  }
  ctx.io.out << table.Render();
  return kExitOk;
}

int RunPause(CommandContext& ctx) {
  absl::StatusOr<v1::QueueInfo> info = ctx.client.PauseQueue(ctx.args.positional[0]);
  if (!info.ok()) return BrokerError(ctx, info.status());
  if (ctx.json) {
    ctx.io.out << ToJson(*info) << "\n";
  } else {
    ctx.io.out << info->name() << " paused";
    // Pausing stops new leases only; say so when some jobs are still running.
    if (info->active() > 0) ctx.io.out << " (" << info->active() << " active jobs run on)";
    ctx.io.out << "\n";
  }
  return kExitOk;
}

int RunResume(CommandContext& ctx) {
  absl::StatusOr<v1::QueueInfo> info = ctx.client.ResumeQueue(ctx.args.positional[0]);
  if (!info.ok()) return BrokerError(ctx, info.status());
  ctx.io.out << (ctx.json ? ToJson(*info) : info->name() + " resumed") << "\n";
  return kExitOk;
}

int RunPurge(CommandContext& ctx) {
  std::vector<v1::JobState> states;
  std::vector<std::string> names;
  for (const std::string& text : ctx.args.GetAll("--state")) {
    absl::StatusOr<v1::JobState> state = ParseState(text);
    if (!state.ok()) return UsageError(ctx, std::string(state.status().message()));
    states.push_back(*state);
    names.push_back(StateName(*state));
  }
  if (names.empty()) names = {"COMPLETED", "FAILED", "CANCELLED"};
  absl::StatusOr<int64_t> purged = ctx.client.PurgeQueue(ctx.args.positional[0], states);
  if (!purged.ok()) return BrokerError(ctx, purged.status());
  if (ctx.json) {
    v1::PurgeQueueResponse resp;
    resp.set_purged(*purged);
    ctx.io.out << ToJson(resp) << "\n";
  } else {
    ctx.io.out << "purged " << *purged << " job" << (*purged == 1 ? "" : "s") << " ("
               << absl::StrJoin(names, ", ") << ") from " << ctx.args.positional[0] << "\n";
  }
  return kExitOk;
}

int RunPolicyGet(CommandContext& ctx) {
  absl::StatusOr<v1::QueueInfo> info = ctx.client.GetQueue(ctx.args.positional[0]);
  if (!info.ok()) return BrokerError(ctx, info.status());
  ctx.io.out << ToJson(info->policy(), /*pretty=*/true) << "\n";
  return kExitOk;
}

int RunPolicySet(CommandContext& ctx) {
  std::string json = ctx.args.positional[1];
  if (json == "-") {
    json.assign(std::istreambuf_iterator<char>(ctx.io.in), std::istreambuf_iterator<char>());
  }
  v1::UpdateQueuePolicyRequest req;
  req.set_queue(ctx.args.positional[0]);
  req.set_reset(ctx.args.Has("--reset"));
  // Unknown fields are refused: a typo must not silently change nothing.
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, req.mutable_policy());
  if (!parsed.ok()) {
    return UsageError(ctx, absl::StrCat("JSON is not a QueuePolicy: ", parsed.message().ToString(),
                                        " (fields are lowerCamelCase, e.g. "
                                        "{\"maxConcurrency\":5})"));
  }
  absl::StatusOr<v1::QueueInfo> info = ctx.client.UpdateQueuePolicy(req);
  if (!info.ok()) return BrokerError(ctx, info.status());
  ctx.io.out << ToJson(info->policy(), /*pretty=*/true) << "\n";
  return kExitOk;
}

int RunHealth(CommandContext& ctx) {
  absl::Status health = ctx.client.Health();
  if (!health.ok()) return BrokerError(ctx, health);
  ctx.io.out << (ctx.json ? R"({"status":"SERVING"})" : "SERVING") << "\n";
  return kExitOk;
}

int RunCluster(CommandContext& ctx) {
  absl::StatusOr<v1::ClusterInfo> info = ctx.client.GetCluster();
  if (!info.ok()) return BrokerError(ctx, info.status());
  ctx.io.out << (ctx.json ? ToJson(*info) + "\n" : FormatCluster(*info));
  return kExitOk;
}

}  // namespace jobbroker::cli
