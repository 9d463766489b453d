#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/job.h"
#include "core/watchers.h"

namespace jobbroker::testing {

// Records what the broker tells one watcher.
class RecordingWatcher : public core::JobWatcher {
 public:
  void Changed(core::Job job) override {
    absl::MutexLock lock(&mu_);
    seen_.push_back(std::move(job));
  }
  void End(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ended_ = std::move(status);
  }
  std::vector<core::JobState> states() {
    absl::MutexLock lock(&mu_);
    std::vector<core::JobState> out;
    for (const core::Job& j : seen_) out.push_back(j.state);
    return out;
  }
  std::vector<core::Job> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  std::optional<absl::Status> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  absl::Mutex mu_;
  std::vector<core::Job> seen_;
  std::optional<absl::Status> ended_;
};

}  // namespace jobbroker::testing
