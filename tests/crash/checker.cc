#include "tests/crash/checker.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/time_util.h"

namespace jobbroker::crash {
namespace {

// Splits `text` into complete lines; counts a last line without its newline as torn.
std::vector<absl::string_view> CompleteLines(absl::string_view text, CrashLogs& logs) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  // StrSplit yields one piece after the last '\n': empty for a complete file.
  if (!lines.back().empty()) ++logs.torn_lines;
  lines.pop_back();
  return lines;
}

bool ToInt(absl::string_view s, int64_t* out) { return absl::SimpleAtoi(s, out); }

bool ToInt(absl::string_view s, int* out) { return absl::SimpleAtoi(s, out); }

bool ToBool(absl::string_view s, bool* out) {
  if (s != "0" && s != "1") return false;
  *out = s == "1";
  return true;
}

void Malformed(absl::string_view where, absl::string_view line, CrashLogs& logs) {
  logs.malformed.push_back(absl::StrCat(where, ": ", line));
}

struct WorkerLineType {
  const char* name;
  WorkerEventType type;
  size_t fields;  // including the timestamp and the type
};

constexpr WorkerLineType kWorkerLines[] = {
    {"START", WorkerEventType::kStart, 4},
    {"CONNECT", WorkerEventType::kConnect, 4},
    {"DISCONNECT", WorkerEventType::kDisconnect, 5},
    {"RECV", WorkerEventType::kReceived, 7},
    {"LOST", WorkerEventType::kLeaseLost, 4},
    {"SKIP", WorkerEventType::kSkipped, 6},
    {"ACK_OK", WorkerEventType::kAckOk, 6},
    {"ACK_REFUSED", WorkerEventType::kAckRefused, 7},
    {"FAIL_OK", WorkerEventType::kFailOk, 7},
    {"FAIL_REFUSED", WorkerEventType::kFailRefused, 7},
    {"ANSWER_RETRY", WorkerEventType::kAnswerRetry, 7},
};

bool ParseWorkerFields(const std::vector<absl::string_view>& f, WorkerEvent& e) {
  const WorkerLineType* kind = nullptr;
  for (const WorkerLineType& k : kWorkerLines) {
    if (f[1] == k.name) kind = &k;
  }
  if (kind == nullptr || f.size() != kind->fields || !ToInt(f[0], &e.ts)) return false;
  e.type = kind->type;
  e.instance = std::string(f[2]);
  switch (e.type) {
    case WorkerEventType::kStart:
      return true;
    case WorkerEventType::kConnect:
      return ToInt(f[3], &e.conn);
    case WorkerEventType::kDisconnect:
      return ToInt(f[3], &e.conn) && ToInt(f[4], &e.code);
    case WorkerEventType::kLeaseLost:
      e.job_id = std::string(f[3]);
      return true;
    default:
      break;
  }
  // The rest name one lease: <job_id> <attempt> <lease_id> and one more field for most.
  e.job_id = std::string(f[3]);
  e.lease_id = std::string(f[5]);
  if (!ToInt(f[4], &e.attempt)) return false;
  switch (e.type) {
    case WorkerEventType::kReceived:
      return ToInt(f[6], &e.conn);
    case WorkerEventType::kFailOk:
      return ToBool(f[6], &e.terminal);
    case WorkerEventType::kAckRefused:
    case WorkerEventType::kFailRefused:
    case WorkerEventType::kAnswerRetry:
      return ToInt(f[6], &e.code);
    default:
      return true;
  }
}

struct DriverLineType {
  const char* name;
  DriverEventType type;
  size_t fields;
};

constexpr DriverLineType kDriverLines[] = {
    {"SEED", DriverEventType::kSeed, 3},
    {"BROKER_UP", DriverEventType::kBrokerUp, 4},
    {"BROKER_KILL", DriverEventType::kBrokerKill, 4},
    {"WORKER_UP", DriverEventType::kWorkerUp, 4},
    {"WORKER_KILL", DriverEventType::kWorkerKill, 4},
    {"WORKER_STOP", DriverEventType::kWorkerStop, 4},
    {"WORKER_CONT", DriverEventType::kWorkerCont, 4},
    {"PRODUCER_EXIT", DriverEventType::kProducerExit, 4},
    {"SETTLED", DriverEventType::kSettled, 3},
};

bool ParseDriverFields(const std::vector<absl::string_view>& f, DriverEvent& e) {
  const DriverLineType* kind = nullptr;
  for (const DriverLineType& k : kDriverLines) {
    if (f[1] == k.name) kind = &k;
  }
  if (kind == nullptr || f.size() != kind->fields || !ToInt(f[0], &e.ts)) return false;
  e.type = kind->type;
  if (f.size() == 3) return ToInt(f[2], &e.value);
  e.subject = std::string(f[2]);
  return ToInt(f[3], &e.value);
}

int64_t Micros(const google::protobuf::Timestamp& t) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(t);
}

// What the final job must look like for its payload kind; empty if it does.
std::string FinalStateProblem(const std::string& kind, const v1::Job& job) {
  const bool complete = kind == kKindOk || kind == kKindFlaky;
  v1::FailReason reason = v1::FAIL_REASON_UNSPECIFIED;
  if (kind == kKindPermanent) reason = v1::FAIL_REASON_PERMANENT;
  if (kind == kKindExhaust) reason = v1::FAIL_REASON_ATTEMPTS_EXHAUSTED;
  if (!complete && reason == v1::FAIL_REASON_UNSPECIFIED) {
    return absl::StrCat("unknown payload kind '", kind, "'");
  }
  if (complete && job.state() != v1::JOB_STATE_COMPLETED) {
    return absl::StrCat("kind ", kind, " must end COMPLETED, is ", v1::JobState_Name(job.state()),
                        " after ", job.attempt(), " attempts (last error: ", job.last_error(), ")");
  }
  if (!complete && (job.state() != v1::JOB_STATE_FAILED || job.fail_reason() != reason)) {
    return absl::StrCat("kind ", kind, " must end FAILED ", v1::FailReason_Name(reason), ", is ",
                        v1::JobState_Name(job.state()), " ", v1::FailReason_Name(job.fail_reason()),
                        " after ", job.attempt(), " attempts");
  }
  return "";
}

// One lease a worker received, with what the worker heard back about it.
struct Run {
  const WorkerEvent* received = nullptr;
  const WorkerEvent* ack_ok = nullptr;
  const WorkerEvent* fail_ok = nullptr;

  bool terminal_answer() const { return ack_ok != nullptr || (fail_ok && fail_ok->terminal); }
};

std::string Describe(const Run& run) {
  return absl::StrCat("attempt ", run.received->attempt, " lease ", run.received->lease_id, " on ",
                      run.received->instance, " at ", run.received->ts);
}

// The interval a worker instance spent stopped: [stop, cont), cont = max when never continued.
struct Stop {
  int64_t from;
  int64_t to;
};

struct DriverTimeline {
  std::map<std::string, std::vector<int64_t>> worker_kills;
  std::map<std::string, std::vector<Stop>> worker_stops;
  std::vector<int64_t> broker_kills;
};

DriverTimeline BuildTimeline(const std::vector<DriverEvent>& events) {
  DriverTimeline t;
  std::vector<const DriverEvent*> sorted;
  for (const DriverEvent& e : events) sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const DriverEvent* a, const DriverEvent* b) { return a->ts < b->ts; });
  for (const DriverEvent* e : sorted) {
    switch (e->type) {
      case DriverEventType::kBrokerKill:
        t.broker_kills.push_back(e->ts);
        break;
      case DriverEventType::kWorkerKill:
        t.worker_kills[e->subject].push_back(e->ts);
        break;
      case DriverEventType::kWorkerStop:
        t.worker_stops[e->subject].push_back({e->ts, std::numeric_limits<int64_t>::max()});
        break;
      case DriverEventType::kWorkerCont: {
        std::vector<Stop>& stops = t.worker_stops[e->subject];
        if (!stops.empty() && stops.back().to == std::numeric_limits<int64_t>::max()) {
          stops.back().to = e->ts;
        }
        break;
      }
      default:
        break;
    }
  }
  return t;
}

bool AnyIn(const std::vector<int64_t>& times, int64_t lo, int64_t hi) {
  return std::any_of(times.begin(), times.end(), [&](int64_t t) { return t > lo && t < hi; });
}

// Why `next` followed `prev` (same job, `prev` earlier). `record` is the broker's record of
// `prev`'s attempt (null if history no longer holds it); `lease_start` is when the broker leased
// `prev` (from the record), or when the worker logged it.
RerunCause Explain(const Run& prev, const Run& next, const v1::AttemptRecord* record,
                   int64_t lease_start, const std::string& kind, const DriverTimeline& timeline) {
  const bool intends_failure = kind == kKindFlaky || kind == kKindExhaust;
  const bool worker_failed =
      record != nullptr && (record->outcome() == v1::ATTEMPT_OUTCOME_ERROR ||
                            record->outcome() == v1::ATTEMPT_OUTCOME_PERMANENT_ERROR);
  // The fail may have committed with its answer lost to a crash: the record says so then.
  if (intends_failure && ((prev.fail_ok != nullptr && !prev.fail_ok->terminal) || worker_failed)) {
    return RerunCause::kIntendedRetry;
  }
  // Only a lease that ran out lets a kill, a stop or a crash cause a rerun.
  if (worker_failed) return RerunCause::kUnexplained;
  const int64_t lo = std::min(lease_start, prev.received->ts);
  const int64_t hi = next.received->ts;
  const std::string& instance = prev.received->instance;
  if (auto it = timeline.worker_kills.find(instance);
      it != timeline.worker_kills.end() && AnyIn(it->second, lo, hi)) {
    return RerunCause::kWorkerKill;
  }
  // A stopped worker's socket still takes pushes, so the stop may come before the lease.
  if (auto it = timeline.worker_stops.find(instance); it != timeline.worker_stops.end()) {
    for (const Stop& s : it->second) {
      if (s.from < hi && s.to > lo) return RerunCause::kWorkerStop;
    }
  }
  if (AnyIn(timeline.broker_kills, lo, hi)) return RerunCause::kBrokerCrash;
  return RerunCause::kUnexplained;
}

const char* CauseName(RerunCause cause) {
  switch (cause) {
    case RerunCause::kIntendedRetry:
      return "intended failure / retry";
    case RerunCause::kWorkerKill:
      return "worker SIGKILL";
    case RerunCause::kWorkerStop:
      return "worker SIGSTOP (lease expiry)";
    case RerunCause::kBrokerCrash:
      return "broker crash between lease and ack";
    case RerunCause::kUnexplained:
      return "UNEXPLAINED";
  }
  return "?";
}

}  // namespace

void ParseProducerLog(absl::string_view producer, absl::string_view text, CrashLogs& logs) {
  for (absl::string_view line : CompleteLines(text, logs)) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    EnqueueRecord e;
    e.producer = std::string(producer);
    if (f.size() != 9 || f[1] != "ENQ" || !ToInt(f[0], &e.ts) || !ToBool(f[6], &e.deduplicated) ||
        !ToInt(f[7], &e.tries) || !ToInt(f[8], &e.batch) || f[2].empty() || f[3].empty()) {
      Malformed(absl::StrCat("producer ", producer), line, logs);
      continue;
    }
    e.job_id = std::string(f[2]);
    e.dedup_key = std::string(f[3]);
    e.kind = std::string(f[4]);
    e.queue = std::string(f[5]);
    logs.enqueues.push_back(std::move(e));
  }
}

void ParseWorkerLog(absl::string_view text, CrashLogs& logs) {
  for (absl::string_view line : CompleteLines(text, logs)) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    WorkerEvent e;
    if (f.size() < 3 || !ParseWorkerFields(f, e)) {
      Malformed("worker", line, logs);
      continue;
    }
    logs.worker_events.push_back(std::move(e));
  }
}

void ParseDriverLog(absl::string_view text, CrashLogs& logs) {
  for (absl::string_view line : CompleteLines(text, logs)) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    DriverEvent e;
    if (f.size() < 3 || !ParseDriverFields(f, e)) {
      Malformed("driver", line, logs);
      continue;
    }
    logs.driver_events.push_back(std::move(e));
  }
}

const char* ViolationKindName(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kLost:
      return "LOST";
    case ViolationKind::kWrongFinalState:
      return "WRONG_FINAL_STATE";
    case ViolationKind::kUnknownJob:
      return "UNKNOWN_JOB";
    case ViolationKind::kDedupTwoIds:
      return "DEDUP_TWO_IDS";
    case ViolationKind::kSpuriousDedup:
      return "SPURIOUS_DEDUP";
    case ViolationKind::kUnexplainedDuplicate:
      return "UNEXPLAINED_DUPLICATE";
    case ViolationKind::kUndoneAck:
      return "UNDONE_ACK";
    case ViolationKind::kAttemptReused:
      return "ATTEMPT_REUSED";
    case ViolationKind::kOverlappingLease:
      return "OVERLAPPING_LEASE";
    case ViolationKind::kMalformedLog:
      return "MALFORMED_LOG";
  }
  return "?";
}

Report Check(const CrashLogs& logs, const std::vector<v1::Job>& final_jobs) {
  Report report;
  Summary& s = report.summary;
  auto violate = [&report](ViolationKind kind, const std::string& job, std::string detail) {
    report.violations.push_back({kind, job, std::move(detail)});
  };
  for (const std::string& line : logs.malformed) violate(ViolationKind::kMalformedLog, "", line);
  s.torn_lines = logs.torn_lines;

  // Acknowledged enqueues: one id per dedup key, and the same key for every answer of an id.
  std::map<std::string, const EnqueueRecord*> enqueued;  // job id -> first acknowledgement
  std::map<std::string, std::set<std::string>> ids_by_key;
  std::set<std::pair<std::string, int64_t>> batches;
  for (const EnqueueRecord& e : logs.enqueues) {
    ids_by_key[e.dedup_key].insert(e.job_id);
    if (e.batch == 0) {
      ++s.single_enqueues;
    } else {
      batches.insert({e.producer, e.batch});
      ++s.jobs_in_batches;
    }
    if (e.tries > 1) ++s.enqueues_retried;
    if (e.deduplicated && e.tries > 1) ++s.dedup_hits_after_crash;
    if (e.deduplicated && e.tries <= 1) {
      violate(ViolationKind::kSpuriousDedup, e.job_id,
              absl::StrCat("dedup key ", e.dedup_key, " of ", e.producer,
                           " was answered deduplicated on its first try"));
    }
    auto [it, inserted] = enqueued.emplace(e.job_id, &e);
    if (!inserted && it->second->dedup_key != e.dedup_key) {
      violate(ViolationKind::kDedupTwoIds, e.job_id,
              absl::StrCat("one job id was returned for dedup keys ", it->second->dedup_key,
                           " and ", e.dedup_key));
    }
  }
  s.batches = static_cast<int64_t>(batches.size());
  for (const auto& [key, ids] : ids_by_key) {
    if (ids.size() > 1) {
      violate(ViolationKind::kDedupTwoIds, *ids.begin(),
              absl::StrCat("dedup key ", key, " yielded job ids ", absl::StrJoin(ids, ", ")));
    }
  }
  s.jobs_enqueued = static_cast<int64_t>(enqueued.size());
  for (const auto& [id, e] : enqueued) {
    if (e->kind == kKindOk) ++s.jobs_by_kind_ok;
    if (e->kind == kKindFlaky) ++s.jobs_by_kind_flaky;
    if (e->kind == kKindPermanent) ++s.jobs_by_kind_perm;
    if (e->kind == kKindExhaust) ++s.jobs_by_kind_exhaust;
  }

  // The final state: every job known, none lost, each ended as its kind says.
  std::map<std::string, const v1::Job*> final_by_id;
  std::map<std::pair<std::string, std::string>, std::set<std::string>> final_ids_by_key;
  for (const v1::Job& job : final_jobs) {
    final_by_id[job.id()] = &job;
    if (!job.dedup_key().empty()) final_ids_by_key[{job.queue(), job.dedup_key()}].insert(job.id());
    if (job.state() == v1::JOB_STATE_COMPLETED) {
      ++s.final_completed;
    } else if (job.state() == v1::JOB_STATE_FAILED) {
      ++s.final_failed;
    } else {
      ++s.final_other;
    }
    // Attempts follow one another: one starts only after the one before it ended (an expired
    // lease ends at its deadline).
    for (int i = 0; i + 1 < job.attempts_size(); ++i) {
      const v1::AttemptRecord& a = job.attempts(i);
      const v1::AttemptRecord& b = job.attempts(i + 1);
      if (b.attempt() == a.attempt() + 1 && a.has_ended_at() && b.has_started_at() &&
          Micros(b.started_at()) < Micros(a.ended_at())) {
        violate(
            ViolationKind::kOverlappingLease, job.id(),
            absl::StrCat("attempt ", b.attempt(), " started at ", Micros(b.started_at()),
                         ", before attempt ", a.attempt(), " ended (",
                         v1::AttemptOutcome_Name(a.outcome()), " at ", Micros(a.ended_at()), ")"));
      }
    }
    if (!enqueued.contains(job.id())) {
      violate(ViolationKind::kUnknownJob, job.id(),
              absl::StrCat("the broker holds a job (", v1::JobState_Name(job.state()),
                           ", dedup key '", job.dedup_key(), "') no enqueue was answered with"));
    }
  }
  for (const auto& [key, ids] : final_ids_by_key) {
    if (ids.size() > 1) {
      violate(ViolationKind::kDedupTwoIds, *ids.begin(),
              absl::StrCat("the broker holds jobs ", absl::StrJoin(ids, ", "), " for dedup key ",
                           key.second, " of queue ", key.first));
    }
  }
  for (const auto& [id, e] : enqueued) {
    auto it = final_by_id.find(id);
    if (it == final_by_id.end()) {
      ++s.lost;
      violate(ViolationKind::kLost, id,
              absl::StrCat("acknowledged to ", e->producer, " at ", e->ts, " (dedup key ",
                           e->dedup_key, ", kind ", e->kind, ") but not in the final state"));
      continue;
    }
    const v1::Job& job = *it->second;
    std::string problem = FinalStateProblem(e->kind, job);
    if (problem.empty() && (job.dedup_key() != e->dedup_key || job.queue() != e->queue)) {
      problem = absl::StrCat("enqueued as ", e->queue, "/", e->dedup_key, ", holds ", job.queue(),
                             "/", job.dedup_key());
    }
    if (!problem.empty()) violate(ViolationKind::kWrongFinalState, id, problem);
  }

  // Runs: every lease a worker received, with its acknowledged answers.
  std::map<std::string, std::map<std::string, Run>> runs;  // job id -> lease id -> run
  for (const WorkerEvent& e : logs.worker_events) {
    if (e.type != WorkerEventType::kReceived) continue;
    Run& run = runs[e.job_id][e.lease_id];
    if (run.received == nullptr) run.received = &e;
  }
  for (const WorkerEvent& e : logs.worker_events) {
    switch (e.type) {
      case WorkerEventType::kAckOk:
        ++s.acks_ok;
        break;
      case WorkerEventType::kFailOk:
        ++s.fails_ok;
        break;
      case WorkerEventType::kAckRefused:
        ++s.acks_refused;
        continue;
      case WorkerEventType::kFailRefused:
        ++s.fails_refused;
        continue;
      default:
        continue;
    }
    auto job_it = runs.find(e.job_id);
    auto run_it = job_it == runs.end() ? std::map<std::string, Run>::iterator()
                                       : job_it->second.find(e.lease_id);
    if (job_it == runs.end() || run_it == job_it->second.end()) {
      // An answer for a lease whose receipt was not logged cannot come from our workers.
      violate(ViolationKind::kMalformedLog, e.job_id,
              absl::StrCat("answer for lease ", e.lease_id, " that no worker logged receiving"));
      continue;
    }
    (e.type == WorkerEventType::kAckOk ? run_it->second.ack_ok : run_it->second.fail_ok) = &e;
  }

  const DriverTimeline timeline = BuildTimeline(logs.driver_events);
  s.broker_kills = static_cast<int64_t>(timeline.broker_kills.size());
  for (const auto& [instance, kills] : timeline.worker_kills) s.worker_kills += kills.size();
  for (const auto& [instance, stops] : timeline.worker_stops) s.worker_stops += stops.size();
  for (RerunCause c : {RerunCause::kIntendedRetry, RerunCause::kWorkerKill, RerunCause::kWorkerStop,
                       RerunCause::kBrokerCrash, RerunCause::kUnexplained}) {
    s.reruns[c] = 0;
  }

  for (const auto& [job_id, by_lease] : runs) {
    std::vector<const Run*> ordered;
    for (const auto& [lease, run] : by_lease) ordered.push_back(&run);
    // By attempt: a stopped worker may log an old push after a newer attempt started.
    std::sort(ordered.begin(), ordered.end(), [](const Run* a, const Run* b) {
      return std::make_pair(a->received->attempt, a->received->ts) <
             std::make_pair(b->received->attempt, b->received->ts);
    });
    s.runs += static_cast<int64_t>(ordered.size());
    if (ordered.size() > 1) ++s.jobs_run_more_than_once;

    auto enq_it = enqueued.find(job_id);
    auto final_it = final_by_id.find(job_id);
    if (enq_it == enqueued.end()) {
      violate(ViolationKind::kUnknownJob, job_id,
              absl::StrCat("a worker received it (", Describe(*ordered.front()),
                           ") but no enqueue was answered with it"));
      continue;
    }
    const std::string& kind = enq_it->second->kind;
    const v1::Job* job = final_it == final_by_id.end() ? nullptr : final_it->second;
    auto attempt_record = [job](int attempt) -> const v1::AttemptRecord* {
      if (job == nullptr) return nullptr;
      for (const v1::AttemptRecord& a : job->attempts()) {
        if (a.attempt() == attempt) return &a;
      }
      return nullptr;
    };

    std::set<int> attempts_seen;
    for (const Run* run : ordered) attempts_seen.insert(run->received->attempt);
    if (job != nullptr && job->attempt() > static_cast<int>(attempts_seen.size())) {
      s.attempts_unseen += job->attempt() - static_cast<int>(attempts_seen.size());
    }

    // An acknowledged ack must be the job's last word: COMPLETED by that very attempt.
    for (const Run* run : ordered) {
      if (!run->terminal_answer()) continue;
      const bool acked = run->ack_ok != nullptr;
      const v1::JobState want = acked ? v1::JOB_STATE_COMPLETED : v1::JOB_STATE_FAILED;
      const v1::AttemptRecord* record = attempt_record(run->received->attempt);
      const bool record_agrees =
          record == nullptr || (acked ? record->outcome() == v1::ATTEMPT_OUTCOME_COMPLETED
                                      : record->outcome() != v1::ATTEMPT_OUTCOME_COMPLETED &&
                                            record->outcome() != v1::ATTEMPT_OUTCOME_LEASE_EXPIRED);
      if (job == nullptr || job->state() != want || job->attempt() != run->received->attempt ||
          !record_agrees) {
        violate(ViolationKind::kUndoneAck, job_id,
                absl::StrCat(acked ? "ack" : "terminal fail", " of ", Describe(*run),
                             " was acknowledged, but the job ended ",
                             job == nullptr ? "missing"
                                            : absl::StrCat(v1::JobState_Name(job->state()),
                                                           " at attempt ", job->attempt())));
      }
    }

    for (size_t i = 0; i + 1 < ordered.size(); ++i) {
      const Run& prev = *ordered[i];
      const Run& next = *ordered[i + 1];
      if (prev.received->attempt == next.received->attempt) {
        ++s.attempts_reused;
        violate(ViolationKind::kAttemptReused, job_id,
                absl::StrCat("attempt ", prev.received->attempt,
                             " was leased twice: ", Describe(prev), " and ", Describe(next)));
      }
      if (prev.terminal_answer()) {
        violate(ViolationKind::kUndoneAck, job_id,
                absl::StrCat("received again (", Describe(next), ") after the ",
                             prev.ack_ok != nullptr ? "ack" : "terminal fail", " of ",
                             Describe(prev), " was acknowledged"));
        continue;
      }
      const v1::AttemptRecord* record = attempt_record(prev.received->attempt);
      if (record != nullptr && record->outcome() == v1::ATTEMPT_OUTCOME_COMPLETED) {
        violate(ViolationKind::kUndoneAck, job_id,
                absl::StrCat("received again (", Describe(next), ") though the broker recorded ",
                             Describe(prev), " as completed"));
        continue;
      }
      const int64_t lease_start = record != nullptr && record->has_started_at()
                                      ? Micros(record->started_at())
                                      : prev.received->ts;
      const RerunCause cause = Explain(prev, next, record, lease_start, kind, timeline);
      ++s.reruns[cause];
      if (cause == RerunCause::kUnexplained) {
        violate(
            ViolationKind::kUnexplainedDuplicate, job_id,
            absl::StrCat(
                "ran again (", Describe(next), ") after ", Describe(prev),
                " with no kill, stop, broker crash or intended failure in between; broker "
                "recorded that attempt as ",
                record == nullptr ? "(no record)" : v1::AttemptOutcome_Name(record->outcome())));
      }
    }
  }
  return report;
}

std::string Report::SummaryTable(
    const std::vector<std::pair<std::string, std::string>>& extra) const {
  const Summary& s = summary;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"jobs enqueued (acknowledged ids)", absl::StrCat(s.jobs_enqueued)},
      {"  kinds ok / flaky / perm / exhaust",
       absl::StrCat(s.jobs_by_kind_ok, " / ", s.jobs_by_kind_flaky, " / ", s.jobs_by_kind_perm,
                    " / ", s.jobs_by_kind_exhaust)},
      {"  single enqueues", absl::StrCat(s.single_enqueues)},
      {"  batches (jobs in them)", absl::StrCat(s.batches, " (", s.jobs_in_batches, ")")},
      {"  enqueues acknowledged after a retry", absl::StrCat(s.enqueues_retried)},
      {"  dedup hits after crash", absl::StrCat(s.dedup_hits_after_crash)},
      {"broker kills (SIGKILL)", absl::StrCat(s.broker_kills)},
      {"worker kills (SIGKILL)", absl::StrCat(s.worker_kills)},
      {"worker stops (SIGSTOP > lease)", absl::StrCat(s.worker_stops)},
      {"jobs received by workers (runs)", absl::StrCat(s.runs)},
      {"  jobs run more than once", absl::StrCat(s.jobs_run_more_than_once)},
  };
  for (const auto& [cause, n] : s.reruns) {
    rows.push_back({absl::StrCat("  reruns: ", CauseName(cause)), absl::StrCat(n)});
  }
  rows.insert(
      rows.end(),
      {
          {"  attempts no worker logged", absl::StrCat(s.attempts_unseen)},
          {"  attempt numbers leased twice", absl::StrCat(s.attempts_reused)},
          {"acks acknowledged / refused", absl::StrCat(s.acks_ok, " / ", s.acks_refused)},
          {"fails acknowledged / refused", absl::StrCat(s.fails_ok, " / ", s.fails_refused)},
          {"final COMPLETED / FAILED / other",
           absl::StrCat(s.final_completed, " / ", s.final_failed, " / ", s.final_other)},
          {"torn log lines skipped", absl::StrCat(s.torn_lines)},
          {"lost", absl::StrCat(s.lost)},
          {"violations", absl::StrCat(violations.size())},
      });
  rows.insert(rows.end(), extra.begin(), extra.end());
  size_t width = 0;
  for (const auto& [name, value] : rows) width = std::max(width, name.size());
  std::string out;
  for (const auto& [name, value] : rows) {
    absl::StrAppend(&out, absl::StrFormat("  %-*s  %s\n", static_cast<int>(width), name, value));
  }
  return out;
}

std::string Report::ViolationList() const {
  std::string out;
  for (const Violation& v : violations) {
    absl::StrAppend(&out, ViolationKindName(v.kind), " job=", v.job_id, ": ", v.detail, "\n");
  }
  return out;
}

}  // namespace jobbroker::crash
