#include "tests/crash/final_state.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "jobbroker/v1/admin.grpc.pb.h"
#include "tests/crash/channel.h"
#include "tests/crash/checker.h"

namespace jobbroker::crash {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(30);

void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
}

absl::Status Failed(absl::string_view what, const grpc::Status& s) {
  return absl::UnavailableError(absl::StrCat(
      what, " failed with code ", static_cast<int>(s.error_code()), ": ", s.error_message()));
}

absl::StatusOr<std::vector<std::string>> QueueNames(v1::Admin::Stub& admin,
                                                    std::vector<v1::QueueInfo>* infos) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListQueuesResponse response;
  const grpc::Status s = admin.ListQueues(&ctx, v1::ListQueuesRequest(), &response);
  if (!s.ok()) return Failed("ListQueues", s);
  std::vector<std::string> names;
  for (const v1::QueueInfo& q : response.queues()) {
    names.push_back(q.name());
    if (infos != nullptr) infos->push_back(q);
  }
  return names;
}

}  // namespace

absl::Status PutEverySecondSchedule(const std::string& address) {
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(DialBroker(address));
  v1::PutScheduleRequest request;
  v1::Schedule* schedule = request.mutable_schedule();
  schedule->set_schedule_id(kScheduleId);
  schedule->mutable_every()->set_seconds(1);
  schedule->mutable_template_()->set_queue(kScheduledQueue);
  schedule->mutable_template_()->set_payload("run");
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::Schedule answer;
  const grpc::Status s = admin->PutSchedule(&ctx, request, &answer);
  if (!s.ok()) return Failed("PutSchedule", s);
  return absl::OkStatus();
}

absl::StatusOr<QueueCounts> CountJobs(const std::string& address) {
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(DialBroker(address));
  std::vector<v1::QueueInfo> infos;
  absl::StatusOr<std::vector<std::string>> names = QueueNames(*admin, &infos);
  if (!names.ok()) return names.status();
  QueueCounts counts;
  for (const v1::QueueInfo& q : infos) {
    if (q.name() == kScheduledQueue) continue;  // its runs stay READY: nobody works them
    for (const auto& [state, n] : q.counts()) {
      v1::JobState s;
      if (!v1::JobState_Parse(state, &s)) continue;
      const bool terminal =
          s == v1::JOB_STATE_COMPLETED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
      (terminal ? counts.terminal : counts.open) += n;
    }
  }
  return counts;
}

absl::StatusOr<FinalState> FetchFinalState(const std::string& address,
                                           const std::set<std::string>& expected_ids) {
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(DialBroker(address));
  absl::StatusOr<std::vector<std::string>> queues = QueueNames(*admin, nullptr);
  if (!queues.ok()) return queues.status();
  std::map<std::string, v1::Job> by_id;
  for (const std::string& queue : *queues) {
    // Every state a job can be in: one left WAITING (its dependency's end never delivered) is
    // a finding of the checker, not a gap between the views.
    for (int state = v1::JOB_STATE_READY; state <= v1::JOB_STATE_WAITING; ++state) {
      std::string token;
      do {
        v1::ListJobsRequest request;
        request.set_queue(queue);
        request.set_state(static_cast<v1::JobState>(state));
        request.set_page_size(1000);
        request.set_page_token(token);
        v1::ListJobsResponse response;
        grpc::ClientContext ctx;
        SetDeadline(ctx);
        const grpc::Status s = admin->ListJobs(&ctx, request, &response);
        if (!s.ok()) return Failed(absl::StrCat("ListJobs ", queue), s);
        for (const v1::Job& job : response.jobs()) by_id[job.id()] = job;
        token = response.next_page_token();
      } while (!token.empty());
    }
  }
  // GetJob is the per-job view; it must agree with the lists.
  FinalState final_state;
  for (const std::string& id : expected_ids) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const grpc::Status s = admin->GetJob(&ctx, request, &job);
    auto listed = by_id.find(id);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      if (listed != by_id.end()) {
        final_state.list_gaps.push_back(absl::StrCat(id, ": listed, but GetJob says NOT_FOUND"));
      }
      continue;  // lost: the checker says so
    }
    if (!s.ok()) return Failed(absl::StrCat("GetJob ", id), s);
    if (listed == by_id.end()) {
      final_state.list_gaps.push_back(absl::StrCat(id, ": GetJob finds it, ListJobs did not"));
    } else if (listed->second.state() != job.state() || listed->second.attempt() != job.attempt()) {
      final_state.list_gaps.push_back(absl::StrCat(id, ": ListJobs and GetJob disagree"));
    }
    by_id[id] = std::move(job);
  }
  for (auto& [id, job] : by_id) final_state.jobs.push_back(std::move(job));
  return final_state;
}

}  // namespace jobbroker::crash
