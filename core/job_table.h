#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "core/ids.h"
#include "core/job.h"
#include "core/store.h"

namespace jobbroker::core {

// Every job the broker holds, and in what form (docs/architecture.md, "Hot and cold jobs"). A
// hot job is whole in memory. A cold one is READY or SCHEDULED and whole only in the store:
// here it is its packed id, and the queue indexes hold the few fields they order by. A backlog
// of millions of waiting jobs then costs tens of bytes each instead of a kilobyte.
//
// The rule that keeps this correct: a job goes cold only while the store holds exactly what
// memory holds of it. Each hot job carries which commit last put it and in what state; Freeze
// takes a job only once that commit is written and the job has not changed since.
//
// Also here: the sequence numbers that order jobs (never reused, not even after a rebuild), and
// the stored records recovery could not decode. Not thread-safe (the broker's mutex guards it).
class JobTable {
 public:
  // HotRef::put_at of a job whose first put is not committed yet.
  static constexpr uint64_t kNotWritten = std::numeric_limits<uint64_t>::max();

  // The jobs a transition puts (seq, state), in order; noted before the transition is handed
  // to the pipeline, stamped with its commit number once it has one (StampPuts).
  using PutList = absl::InlinedVector<std::pair<uint64_t, JobState>, 8>;
  static PutList PutsOf(const Transition& t);

  // Hot jobs by id and by seq; nullptr if not hot (it may be cold, or unknown).
  Job* FindHot(const std::string& id);
  Job* FindHotBySeq(uint64_t seq);
  // A job known to be hot: ACTIVE or ended (never cold), or one just read back.
  Job& Hot(uint64_t seq) { return *by_seq_.at(seq).job; }
  // The packed id of the cold job `seq`, if it is cold.
  std::optional<PackedJobId> ColdId(uint64_t seq) const;

  // Takes a hot job in, with what the store holds of it: `put_at` 0 if the store has exactly
  // this job already (recovery, a read-back), kNotWritten if its first put is still to commit.
  Job& Adopt(std::unique_ptr<Job> job, uint64_t put_at);
  // Records a job that recovery left cold.
  void AddCold(uint64_t seq, PackedJobId id) { cold_.emplace(seq, id); }
  // A cold job read back (then Adopt it) or given up on.
  void ForgetCold(uint64_t seq) { cold_.erase(seq); }
  // Forgets the hot job `seq` (removed by the caller's transition); destroys it.
  void Remove(uint64_t seq);
  // Whether `id` or `seq` is held in either form, and by whom: recovery's check for a damaged
  // store that names a job twice. Empty if neither is held.
  bool HasId(const std::string& id) const { return by_id_.contains(id); }
  bool HasSeq(uint64_t seq) const { return by_seq_.contains(seq) || cold_.contains(seq); }
  std::string IdOfSeq(uint64_t seq) const;

  // Notes that the puts of `puts` are in commit `commit`.
  void StampPuts(const PutList& puts, uint64_t commit);
  // Makes READY/SCHEDULED jobs whose put is `written` (the pipeline's written()) cold, oldest put
  // first, while more than `max_hot` are hot. Call it when no caller holds a Job reference.
  void Freeze(uint64_t written, int64_t max_hot);

  // Sequence numbers: the next one, and raising the next one past `seq` (recovery).
  uint64_t NextSeq() { return next_seq_++; }
  uint64_t peek_next_seq() const { return next_seq_; }
  void SeenSeq(uint64_t seq) { next_seq_ = std::max(next_seq_, seq + 1); }

  // Stored records that do not decode (or cold jobs that could not be read back): counted, and
  // for jobs, why, so GetJob can say so and DeleteJob can remove the record.
  void MarkCorrupt(RecordKind kind, const std::string& key, absl::Status why);
  const absl::Status* CorruptReason(const std::string& id) const;
  // Forgets a corrupt job record (its delete is in the caller's transition). False if unknown.
  bool ForgetCorrupt(const std::string& id);
  int64_t corrupt_records() const { return corrupt_records_; }

  int64_t hot_count() const { return static_cast<int64_t>(by_id_.size()); }
  int64_t cold_count() const { return static_cast<int64_t>(cold_.size()); }

  // Forgets every job and corrupt record (a rebuild from the store). Sequence numbers go on.
  void Clear();

 private:
  // `put_at` is the commit that last put the job (0: the store held it before this process
  // touched it) and `put_state` the state it put, so Freeze can tell whether the store holds
  // exactly what memory does.
  struct HotRef {
    Job* job = nullptr;
    uint64_t put_at = 0;
    JobState put_state = JobState::kReady;
  };
  // Whether the freeze candidate (commit, seq) still describes the job: hot and unchanged since.
  bool Current(uint64_t commit, uint64_t seq) const;

  absl::flat_hash_map<std::string, std::unique_ptr<Job>> by_id_;
  absl::flat_hash_map<uint64_t, HotRef> by_seq_;
  // Cold jobs: seq -> id. Every other fact of them is in the indexes or the store.
  absl::flat_hash_map<uint64_t, PackedJobId> cold_;
  // (commit, seq) of READY/SCHEDULED puts, in commit order: Freeze's candidates. Stale ones (the
  // job changed since, or left) are skipped when met.
  std::deque<std::pair<uint64_t, uint64_t>> freeze_queue_;
  uint64_t next_seq_ = 1;
  absl::flat_hash_map<std::string, absl::Status> corrupt_jobs_;
  int64_t corrupt_records_ = 0;
};

}  // namespace jobbroker::core
