#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/requests.h"
#include "core/stream_sink.h"

namespace jobbroker::testing {

// Records what the broker pushes to one stream.
class RecordingSink : public core::StreamSink {
 public:
  void PushJob(core::LeasedJob job) override {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
  void LeaseLost(std::string job_id, core::AttemptOutcome outcome) override {
    absl::MutexLock lock(&mu_);
    lost_.push_back(std::move(job_id));
    lost_outcomes_.push_back(outcome);
  }
  void CancelRequested(std::string job_id) override {
    absl::MutexLock lock(&mu_);
    cancelled_.push_back(std::move(job_id));
  }
  void End(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ended_ = status;
  }

  std::vector<core::LeasedJob> jobs() {
    absl::MutexLock lock(&mu_);
    return jobs_;
  }
  std::vector<std::string> job_ids() {
    std::vector<std::string> ids;
    for (const core::LeasedJob& j : jobs()) ids.push_back(j.job_id);
    return ids;
  }
  std::vector<std::string> lost() {
    absl::MutexLock lock(&mu_);
    return lost_;
  }
  // Why each lost lease ended, in the order of lost().
  std::vector<core::AttemptOutcome> lost_outcomes() {
    absl::MutexLock lock(&mu_);
    return lost_outcomes_;
  }
  std::vector<std::string> cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  std::optional<absl::Status> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  absl::Mutex mu_;
  std::vector<core::LeasedJob> jobs_;
  std::vector<std::string> lost_, cancelled_;
  std::vector<core::AttemptOutcome> lost_outcomes_;
  std::optional<absl::Status> ended_;
};

}  // namespace jobbroker::testing
