// Broker: finding jobs whatever their form. Hot jobs are whole in the JobTable; cold ones are
// read back from the store when someone needs all of them, and checked against the indexes
// first (core/job_table.h has the rule that keeps the two in step).
#include "absl/strings/str_cat.h"
#include "core/broker.h"

namespace jobbroker::core {

Broker::MemoryCounts Broker::memory_counts() const {
  absl::MutexLock lock(&mu_);
  return {jobs_.hot_count(), jobs_.cold_count()};
}

Job* Broker::FindJobLocked(const std::string& id) {
  if (Job* hot = jobs_.FindHot(id)) return hot;
  if (jobs_.cold_count() == 0) return nullptr;
  // A cold job is found through its stored record's seq. A record of a job memory no longer
  // has (its delete not written yet) names a seq that is not cold, so it is not taken.
  std::optional<PackedJobId> packed = PackJobId(id);
  if (!packed.has_value()) return nullptr;
  absl::StatusOr<Job> stored = store_.ReadJob(options_.partition, id);
  if (!stored.ok()) return nullptr;
  std::optional<PackedJobId> cold = jobs_.ColdId(stored->seq);
  if (!cold.has_value() || !(*cold == *packed)) return nullptr;
  return ThawLocked(stored->seq, *packed);
}

Job* Broker::JobBySeqLocked(uint64_t seq) {
  if (Job* hot = jobs_.FindHotBySeq(seq)) return hot;
  std::optional<PackedJobId> cold = jobs_.ColdId(seq);
  return cold.has_value() ? ThawLocked(seq, *cold) : nullptr;
}

JobState Broker::StateOfLocked(const QueueState& q, uint64_t seq) {
  if (const Job* hot = jobs_.FindHotBySeq(seq)) return hot->state;
  return q.ready_by_seq.contains(seq) ? JobState::kReady : JobState::kScheduled;
}

Job* Broker::ThawLocked(uint64_t seq, PackedJobId packed) {
  const std::string id = UnpackJobId(packed);
  absl::StatusOr<Job> stored = store_.ReadJob(options_.partition, id);
  if (stored.ok()) {
    // The record must be the one the indexes were built from; anything else would corrupt them.
    const Job& j = *stored;
    const QueueState* q = queues_.Find(j.queue);
    bool matches =
        j.seq == seq && q != nullptr && q->all.contains(seq) && j.state == StateOfLocked(*q, seq);
    if (matches && j.state == JobState::kReady) {
      auto g = q->groups.find(j.concurrency_key);
      matches = g != q->groups.end() &&
                g->second.ready.contains({-static_cast<int64_t>(j.priority), seq});
    } else if (matches) {
      matches = deadlines_.HasScheduled(j.run_at, seq);
    }
    if (!matches)
      stored = absl::DataLossError(absl::StrCat("the stored record of job ", id,
                                                " does not match what the indexes hold of it"));
  }
  if (!stored.ok()) {
    DropUnreadableLocked(seq, id, stored.status());
    return nullptr;
  }
  jobs_.ForgetCold(seq);
  // The store has exactly it: it may go cold again.
  return &jobs_.Adopt(std::make_unique<Job>(*std::move(stored)), 0);
}

void Broker::DropUnreadableLocked(uint64_t seq, const std::string& id, absl::Status why) {
  jobs_.ForgetCold(seq);
  for (auto& [name, q] : queues_) {
    if (!q->all.contains(seq)) continue;
    q->DropWaiting(seq);
    deadlines_.DropScheduled(seq);  // its run_at and expiry, whichever it had
    break;
  }
  QuarantineLocked(CorruptRecord{RecordKind::kJob, id, std::move(why)});
}

}  // namespace jobbroker::core
