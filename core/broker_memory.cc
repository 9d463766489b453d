// Broker: which jobs are whole in memory. Hot jobs are; past BrokerOptions::max_hot_jobs, a
// READY or SCHEDULED job whose record is in the store goes cold: only its index entries and its
// packed id stay, and it is read back from the store when someone needs all of it. A backlog of
// millions of waiting jobs then costs tens of bytes each instead of a kilobyte.
//
// The one rule that keeps this correct: a job goes cold only while the store holds exactly what
// memory holds of it. HotRef::put_at/put_state say which put of the job the store must have;
// FreezeLocked takes a job only once that put is written and the job has not changed since.
#include "absl/strings/str_cat.h"
#include "core/broker_internal.h"

namespace jobbroker {
namespace {

bool MayBeCold(JobState s) { return s == JobState::kReady || s == JobState::kScheduled; }

}  // namespace

Broker::MemoryCounts Broker::memory_counts() const {
  absl::MutexLock lock(&mu_);
  return {static_cast<int64_t>(jobs_.size()), static_cast<int64_t>(cold_.size())};
}

void Broker::AdoptLocked(std::unique_ptr<Job> job, uint64_t put_at) {
  Job* j = job.get();
  jobs_by_seq_.emplace(j->seq, HotRef{j, put_at, j->state});
  if (put_at == 0 && MayBeCold(j->state)) freeze_queue_.emplace_back(0, j->seq);
  jobs_.emplace(j->id, std::move(job));
}

Broker::PutList Broker::PutsOf(const Transition& t) {
  PutList puts;
  for (const Job& job : t.put_jobs) puts.emplace_back(job.seq, job.state);
  return puts;
}

void Broker::StampPutsLocked(const PutList& puts, uint64_t commit) {
  for (const auto& [seq, state] : puts) {
    auto it = jobs_by_seq_.find(seq);
    if (it == jobs_by_seq_.end()) continue;  // removed in the same transition
    it->second.put_at = commit;
    it->second.put_state = state;
    if (MayBeCold(state)) freeze_queue_.emplace_back(commit, seq);
  }
}

void Broker::FreezeLocked() {
  if (freeze_queue_.empty()) return;
  const uint64_t written = pipeline_.written();
  // Whether the candidate (commit, seq) still describes the job: hot, unchanged since that put.
  auto current = [this](uint64_t commit, uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_by_seq_.find(seq);
    return it != jobs_by_seq_.end() && it->second.put_at == commit &&
           it->second.put_state == it->second.job->state && MayBeCold(it->second.job->state);
  };
  while (!freeze_queue_.empty()) {
    const auto [commit, seq] = freeze_queue_.front();
    if (commit > written) break;  // the store does not have it yet
    if (current(commit, seq)) {
      if (static_cast<int64_t>(jobs_.size()) <= options_.max_hot_jobs) break;
      auto ref = jobs_by_seq_.find(seq);
      if (std::optional<PackedJobId> packed = PackJobId(ref->second.job->id)) {
        cold_.emplace(seq, *packed);
        jobs_.erase(jobs_.find(ref->second.job->id));  // destroys the job
        jobs_by_seq_.erase(ref);
      }
      // An id NewJobId did not write (a store from elsewhere) cannot be packed: it stays hot.
    }
    freeze_queue_.pop_front();
  }
  // A job that stays hot at the front keeps stale candidates behind it: drop them now and then
  // (amortised: only after the queue doubled).
  if (freeze_queue_.size() > 2 * jobs_.size() + 1024) {
    std::deque<std::pair<uint64_t, uint64_t>> kept;
    for (const auto& [commit, seq] : freeze_queue_)
      if (current(commit, seq)) kept.emplace_back(commit, seq);
    freeze_queue_.swap(kept);
  }
}

Job* Broker::JobBySeq(uint64_t seq) {
  if (auto it = jobs_by_seq_.find(seq); it != jobs_by_seq_.end()) return it->second.job;
  auto c = cold_.find(seq);
  return c == cold_.end() ? nullptr : ThawLocked(seq, c->second);
}

JobState Broker::StateOf(const QueueState& q, uint64_t seq) {
  if (auto it = jobs_by_seq_.find(seq); it != jobs_by_seq_.end()) return it->second.job->state;
  return q.ready_by_seq.contains(seq) ? JobState::kReady : JobState::kScheduled;
}

Job* Broker::ThawLocked(uint64_t seq, PackedJobId packed) {
  const std::string id = UnpackJobId(packed);
  absl::StatusOr<Job> stored = store_.ReadJob(id);
  if (stored.ok()) {
    // The record must be the one the indexes were built from; anything else would corrupt them.
    const Job& j = *stored;
    QueueState* q = FindQueue(j.queue);
    bool matches =
        j.seq == seq && q != nullptr && q->all.contains(seq) && j.state == StateOf(*q, seq);
    if (matches && j.state == JobState::kReady) {
      auto g = q->groups.find(j.concurrency_key);
      matches = g != q->groups.end() &&
                g->second.ready.contains({-static_cast<int64_t>(j.priority), seq});
    } else if (matches) {
      matches = scheduled_.contains({j.run_at, seq});
    }
    if (!matches)
      stored = absl::DataLossError(absl::StrCat("the stored record of job ", id,
                                                " does not match what the indexes hold of it"));
  }
  if (!stored.ok()) {
    DropUnreadable(seq, id, stored.status());
    return nullptr;
  }
  cold_.erase(seq);
  auto owned = std::make_unique<Job>(*std::move(stored));
  Job* job = owned.get();
  AdoptLocked(std::move(owned), 0);  // the store has exactly it: it may go cold again
  return job;
}

void Broker::DropUnreadable(uint64_t seq, const std::string& id, absl::Status why) {
  cold_.erase(seq);
  for (auto& [name, q] : queues_) {
    if (q->all.erase(seq) == 0) continue;
    if (q->ready_by_seq.erase(seq) > 0) {
      --q->counts[static_cast<int>(JobState::kReady)];
      for (auto& [key, g] : q->groups) {
        auto it = std::find_if(g.ready.begin(), g.ready.end(),
                               [seq](const auto& entry) { return entry.second == seq; });
        if (it == g.ready.end()) continue;
        g.ready.erase(it);
        q->MaybeForget(std::string(key));
        break;
      }
    } else {
      --q->counts[static_cast<int>(JobState::kScheduled)];
      auto it = std::find_if(scheduled_.begin(), scheduled_.end(),
                             [seq](const TimeKey& entry) { return entry.second == seq; });
      if (it != scheduled_.end()) scheduled_.erase(it);
    }
    break;
  }
  CorruptRecord record{RecordKind::kJob, id, std::move(why)};
  observer_.CorruptRecordSkipped(record);
  ++corrupt_records_;
  corrupt_jobs_.insert_or_assign(id, std::move(record.reason));
}

}  // namespace jobbroker
