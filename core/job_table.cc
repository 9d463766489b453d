#include "core/job_table.h"

namespace jobbroker::core {
namespace {

bool MayBeCold(JobState s) { return s == JobState::kReady || s == JobState::kScheduled; }

}  // namespace

JobTable::PutList JobTable::PutsOf(const Transition& t) {
  PutList puts;
  for (const Job& job : t.put_jobs) puts.emplace_back(job.seq, job.state);
  return puts;
}

Job* JobTable::FindHot(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.get();
}

Job* JobTable::FindHotBySeq(uint64_t seq) {
  auto it = by_seq_.find(seq);
  return it == by_seq_.end() ? nullptr : it->second.job;
}

std::optional<PackedJobId> JobTable::ColdId(uint64_t seq) const {
  auto it = cold_.find(seq);
  if (it == cold_.end()) return std::nullopt;
  return it->second;
}

Job& JobTable::Adopt(std::unique_ptr<Job> job, uint64_t put_at) {
  Job* j = job.get();
  by_seq_.emplace(j->seq, HotRef{j, put_at, j->state});
  if (put_at == 0 && MayBeCold(j->state)) freeze_queue_.emplace_back(0, j->seq);
  by_id_.emplace(j->id, std::move(job));
  return *j;
}

void JobTable::Remove(uint64_t seq) {
  auto ref = by_seq_.find(seq);
  if (ref == by_seq_.end()) return;
  const std::string id = ref->second.job->id;
  by_seq_.erase(ref);
  by_id_.erase(id);
}

std::string JobTable::IdOfSeq(uint64_t seq) const {
  if (auto h = by_seq_.find(seq); h != by_seq_.end()) return h->second.job->id;
  if (auto c = cold_.find(seq); c != cold_.end()) return UnpackJobId(c->second);
  return "";
}

void JobTable::StampPuts(const PutList& puts, uint64_t commit) {
  for (const auto& [seq, state] : puts) {
    auto it = by_seq_.find(seq);
    if (it == by_seq_.end()) continue;  // removed in the same transition
    it->second.put_at = commit;
    it->second.put_state = state;
    if (MayBeCold(state)) freeze_queue_.emplace_back(commit, seq);
  }
}

bool JobTable::Current(uint64_t commit, uint64_t seq) const {
  auto it = by_seq_.find(seq);
  return it != by_seq_.end() && it->second.put_at == commit &&
         it->second.put_state == it->second.job->state && MayBeCold(it->second.job->state);
}

void JobTable::Freeze(uint64_t written, int64_t max_hot) {
  while (!freeze_queue_.empty()) {
    const auto [commit, seq] = freeze_queue_.front();
    if (commit > written) break;  // the store does not have it yet
    if (Current(commit, seq)) {
      if (hot_count() <= max_hot) break;
      auto ref = by_seq_.find(seq);
      if (std::optional<PackedJobId> packed = PackJobId(ref->second.job->id)) {
        cold_.emplace(seq, *packed);
        by_id_.erase(by_id_.find(ref->second.job->id));  // destroys the job
        by_seq_.erase(ref);
      }
      // An id NewJobId did not write (a store from elsewhere) cannot be packed: it stays hot.
    }
    freeze_queue_.pop_front();
  }
  // A job that stays hot at the front keeps stale candidates behind it: drop them now and then
  // (amortised: only after the queue doubled).
  if (freeze_queue_.size() > 2 * by_id_.size() + 1024) {
    std::deque<std::pair<uint64_t, uint64_t>> kept;
    for (const auto& [commit, seq] : freeze_queue_)
      if (Current(commit, seq)) kept.emplace_back(commit, seq);
    freeze_queue_.swap(kept);
  }
}

void JobTable::MarkCorrupt(RecordKind kind, const std::string& key, absl::Status why) {
  ++corrupt_records_;
  if (kind == RecordKind::kJob) corrupt_jobs_.insert_or_assign(key, std::move(why));
}

const absl::Status* JobTable::CorruptReason(const std::string& id) const {
  auto it = corrupt_jobs_.find(id);
  return it == corrupt_jobs_.end() ? nullptr : &it->second;
}

bool JobTable::ForgetCorrupt(const std::string& id) {
  if (corrupt_jobs_.erase(id) == 0) return false;
  --corrupt_records_;
  return true;
}

void JobTable::Clear() {
  by_seq_.clear();
  by_id_.clear();
  cold_.clear();
  freeze_queue_.clear();
  corrupt_jobs_.clear();
  corrupt_records_ = 0;
}

}  // namespace jobbroker::core
