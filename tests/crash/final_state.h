#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "jobbroker/v1/job.pb.h"

namespace jobbroker::crash {

// Puts the recurring schedule kScheduleId (checker.h): a run every second into kScheduledQueue.
absl::Status PutEverySecondSchedule(const std::string& address);

// Jobs of every queue but kScheduledQueue by state, from Admin.ListQueues.
struct QueueCounts {
  int64_t open = 0;      // READY, SCHEDULED or ACTIVE
  int64_t terminal = 0;  // COMPLETED, FAILED or CANCELLED
};
absl::StatusOr<QueueCounts> CountJobs(const std::string& address);

// Every job the broker holds: Admin.ListJobs over every queue and every state, page by page.
// Then Admin.GetJob for each of `expected_ids`, whose answer is kept; where the two views
// disagree (a job only one of them shows, another state) `list_gaps` says so.
struct FinalState {
  std::vector<jobbroker::v1::Job> jobs;
  std::vector<std::string> list_gaps;
};
absl::StatusOr<FinalState> FetchFinalState(const std::string& address,
                                           const std::set<std::string>& expected_ids);

}  // namespace jobbroker::crash
