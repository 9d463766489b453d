#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/job.h"
#include "core/store.h"
#include "storage/memory_store.h"

namespace jobbroker::testing {

// A MemoryStore whose writes can be made to fail, and that counts what the broker asked of it:
// the store that core's tests run the broker on. Fault injection in the LevelDB SpecialEnv style,
// kept here so that MemoryStore itself is only a store.
//
// Thread-safe, as MemoryStore is.
class FaultyStore final : public core::Store {
 public:
  FaultyStore() = default;
  FaultyStore(const FaultyStore&) = delete;
  FaultyStore& operator=(const FaultyStore&) = delete;

  // The injected error (nothing applied) once FailWritesAfter's budget is spent, else
  // MemoryStore's answer; a Write that MemoryStore refuses (a NUL in a dedup queue) uses none.
  absl::Status Write(absl::Span<const core::Transition> transitions) override;
  absl::StatusOr<core::Job> ReadJob(uint32_t partition, const std::string& id) override {
    return memory_.ReadJob(partition, id);
  }
  // The injected read error while FailRecoveries is on (nothing visited), else MemoryStore's.
  absl::Status Recover(uint32_t partition, core::RecoveryVisitor& visitor) override;
  // Counted; the injected error while a write would fail (the disk is still broken), else OK.
  absl::Status Resume() override;

  // After `n` more successful Write calls (an empty span counts), every Write returns `error`
  // and applies nothing. n = 0 fails the next write; a negative n turns injection off again.
  void FailWritesAfter(int n,
                       absl::Status error = absl::UnavailableError("injected write failure"));

  // Every Recover returns `error` (a read of the store that fails) until called with OK.
  void FailRecoveries(absl::Status error);

  // Write calls that returned OK; Resume calls.
  int64_t successful_writes() const;
  int64_t resume_calls() const;

  // What is stored, as MemoryStore tells it.
  std::optional<core::Job> FindJob(absl::string_view id) const { return memory_.FindJob(id); }
  size_t job_count() const { return memory_.job_count(); }
  size_t dedup_count() const { return memory_.dedup_count(); }
  size_t policy_count() const { return memory_.policy_count(); }

 private:
  storage::MemoryStore memory_;
  mutable absl::Mutex mu_;
  // Write calls left before injected failures start; negative = never.
  int writes_before_failure_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status injected_failure_ ABSL_GUARDED_BY(mu_);
  absl::Status recover_failure_ ABSL_GUARDED_BY(mu_);
  int64_t successful_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resume_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace jobbroker::testing
