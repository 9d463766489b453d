#include "tests/crash/checker.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
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
    {"FAULT", DriverEventType::kFault, 5},
    {"HEAL", DriverEventType::kHeal, 3},
    {"NODE_UP", DriverEventType::kNodeUp, 4},
    {"NODE_KILL", DriverEventType::kNodeKill, 4},
    {"NODE_PAUSE", DriverEventType::kNodePause, 4},
    {"NODE_CONT", DriverEventType::kNodeCont, 4},
    {"NODE_STOP", DriverEventType::kNodeStop, 4},
    {"NODE_EXIT", DriverEventType::kNodeExit, 4},
    {"NODE_SKEW", DriverEventType::kNodeSkew, 4},
    {"ETCD_KILL", DriverEventType::kEtcdKill, 4},
    {"POWER_LOSS", DriverEventType::kPowerLoss, 4},
};

bool ParseDriverFields(const std::vector<absl::string_view>& f, DriverEvent& e) {
  const DriverLineType* kind = nullptr;
  for (const DriverLineType& k : kDriverLines) {
    if (f[1] == k.name) kind = &k;
  }
  if (kind == nullptr || f.size() != kind->fields || !ToInt(f[0], &e.ts)) return false;
  e.type = kind->type;
  if (e.type == DriverEventType::kFault) {  // FAULT <id> <kind> <target>
    e.subject = std::string(f[3]);
    e.target = std::string(f[4]);
    return !e.subject.empty() && !e.target.empty() && ToInt(f[2], &e.value);
  }
  if (f.size() == 3) return ToInt(f[2], &e.value);
  e.subject = std::string(f[2]);
  return ToInt(f[3], &e.value);
}

// What is wrong with a FAULT or HEAL line given the driver events before it; empty if nothing.
std::string FaultProblem(const DriverEvent& e, const std::vector<DriverEvent>& before) {
  if (e.type != DriverEventType::kFault && e.type != DriverEventType::kHeal) return "";
  bool faulted = false;
  bool healed = false;
  for (const DriverEvent& b : before) {
    if (b.value != e.value) continue;
    faulted |= b.type == DriverEventType::kFault;
    healed |= b.type == DriverEventType::kHeal;
  }
  if (e.type == DriverEventType::kFault) return faulted ? "a second FAULT of one id" : "";
  if (!faulted) return "a HEAL of no earlier FAULT";
  return healed ? "a second HEAL of one FAULT" : "";
}

int64_t Micros(const google::protobuf::Timestamp& t) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(t);
}

// What the final job must look like for its payload kind; empty if it does.
std::string FinalStateProblem(const std::string& kind, const v1::Job& job) {
  const bool complete = kind == kKindOk || kind == kKindFlaky || kind == kKindSlow;
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
  std::vector<Stop> faults;  // [FAULT, HEAL], to = max when never healed
};

DriverTimeline BuildTimeline(const std::vector<DriverEvent>& events) {
  DriverTimeline t;
  std::map<int64_t, size_t> fault_index;  // FAULT id -> its place in t.faults
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
      case DriverEventType::kFault:
        fault_index[e->value] = t.faults.size();
        t.faults.push_back({e->ts, std::numeric_limits<int64_t>::max()});
        break;
      case DriverEventType::kHeal:  // ParseDriverLog saw to it that its FAULT came first
        if (auto it = fault_index.find(e->value); it != fault_index.end()) {
          t.faults[it->second].to = e->ts;
        }
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
  // Only a job enqueued with a run-time limit may time out; the broker's record says it did.
  if (record != nullptr && record->outcome() == v1::ATTEMPT_OUTCOME_TIMED_OUT)
    return kind == kKindSlow ? RerunCause::kTimedOut : RerunCause::kUnexplained;
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
  // Any fault of a cluster may hold up a partition's commits (heartbeats too) for longer than a
  // lease: a dead follower until it leaves the in-sync set, etcd between leaders, a frozen node.
  for (const Stop& f : timeline.faults) {
    if (f.from < hi && f.to > lo) return RerunCause::kClusterFault;
  }
  return RerunCause::kUnexplained;
}

// ---- The cluster harness's evidence ----

bool ToUint(absl::string_view s, uint64_t* out) { return absl::SimpleAtoi(s, out); }

bool ToUint(absl::string_view s, uint32_t* out) { return absl::SimpleAtoi(s, out); }

void AppendUtf8(uint32_t code, std::string& out) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xc0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  }
}

// Reads the JSON string that starts at text[*at] (its opening quote) into `out` and moves *at
// past it. Takes every escape of JSON; server/observability/log.cc writes \" \\ \n \t and \u00XX
// (below 0x20), and copies every other byte as is. A \u of a surrogate half is kept as that one
// code point: our writer never escapes one.
bool ReadJsonString(absl::string_view text, size_t* at, std::string& out) {
  if (*at >= text.size() || text[*at] != '"') return false;
  out.clear();
  for (size_t i = *at + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      *at = i + 1;
      return true;
    }
    if (static_cast<unsigned char>(c) < 0x20) return false;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == text.size()) return false;
    switch (text[i]) {
      case '"':
      case '\\':
      case '/':
        out += text[i];
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'u': {
        if (i + 4 >= text.size()) return false;
        uint32_t code = 0;
        for (char h : text.substr(i + 1, 4)) {
          if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) return false;
          code =
              code * 16 + static_cast<uint32_t>(absl::ascii_isdigit(static_cast<unsigned char>(h))
                                                    ? h - '0'
                                                    : absl::ascii_tolower(h) - 'a' + 10);
        }
        AppendUtf8(code, out);
        i += 4;
        break;
      }
      default:
        return false;
    }
  }
  return false;
}

void SkipJsonSpace(absl::string_view text, size_t* at) {
  while (*at < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[*at]))) ++*at;
}

// One line of server/observability/log.h's JSON format: a flat object whose values are all
// strings (a later key wins). False for anything else, a line of another program included. Not
// a JSON library on purpose: the lines are flat and written by our own code.
bool ParseFlatJsonObject(absl::string_view line, std::map<std::string, std::string>& fields) {
  size_t at = 0;
  SkipJsonSpace(line, &at);
  if (at == line.size() || line[at++] != '{') return false;
  SkipJsonSpace(line, &at);
  if (at < line.size() && line[at] == '}') {
    ++at;
  } else {
    for (;;) {
      std::string key;
      std::string value;
      SkipJsonSpace(line, &at);
      if (!ReadJsonString(line, &at, key)) return false;
      SkipJsonSpace(line, &at);
      if (at == line.size() || line[at++] != ':') return false;
      SkipJsonSpace(line, &at);
      if (!ReadJsonString(line, &at, value)) return false;
      fields[key] = std::move(value);
      SkipJsonSpace(line, &at);
      if (at == line.size()) return false;
      const char next = line[at++];
      if (next == '}') break;
      if (next != ',') return false;
    }
  }
  SkipJsonSpace(line, &at);
  return at == line.size();
}

// A partition_role event's fields as a record; false if one is missing or unreadable.
bool RoleRecordOf(const std::map<std::string, std::string>& fields, PartitionRoleRecord& r) {
  auto get = [&fields](const char* key) -> const std::string* {
    auto it = fields.find(key);
    return it == fields.end() ? nullptr : &it->second;
  };
  const std::string* partition = get("partition");
  const std::string* node = get("node");
  const std::string* role = get("role");
  const std::string* epoch = get("epoch");
  if (partition == nullptr || node == nullptr || role == nullptr || epoch == nullptr ||
      node->empty() || role->empty() || !ToUint(*partition, &r.partition) ||
      !ToInt(*epoch, &r.epoch)) {
    return false;
  }
  r.node = *node;
  r.role = *role;
  if (const std::string* time = get("time")) r.time = *time;
  if (const std::string* broken = get("broken")) r.broken = *broken;
  if (const std::string* serving = get("serving")) {
    if (*serving != "true" && *serving != "false") return false;
    r.serving = *serving == "true";
  }
  if (const std::string* log_end = get("log_end");
      log_end != nullptr && !ToUint(*log_end, &r.log_end)) {
    return false;
  }
  return true;
}

// "# partition <p> floor <f> base <seq>/<epoch> applied <a> end <e>"
bool ParseDumpHeader(absl::string_view line, ReplicaLogHeader& h) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
  if (f.size() != 11 || f[0] != "#" || f[1] != "partition" || f[3] != "floor" || f[5] != "base" ||
      f[7] != "applied" || f[9] != "end") {
    return false;
  }
  std::vector<absl::string_view> base = absl::StrSplit(f[6], '/');
  return base.size() == 2 && ToUint(f[2], &h.partition) && ToInt(f[4], &h.epoch_floor) &&
         ToUint(base[0], &h.base_seq) && ToInt(base[1], &h.base_epoch) &&
         ToUint(f[8], &h.applied_seq) && ToUint(f[10], &h.end_seq);
}

bool IsHexDigest(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
  });
}

std::string DescribeRole(const PartitionRoleRecord& r) {
  return absl::StrCat(r.node, " (log ", r.log, ", at ", r.time.empty() ? "?" : r.time, ")");
}

// One writer per epoch (I4 of CLUSTER.md) and each node's log in order; the figures go to `s`.
void CheckWriters(const CrashLogs& logs, Summary& s,
                  const std::function<void(ViolationKind, std::string)>& violate) {
  // (a) Leadership as the nodes logged it: one node per (partition, epoch).
  std::map<std::pair<uint32_t, int64_t>, std::map<std::string, const PartitionRoleRecord*>> led;
  std::set<uint32_t> partitions_led;
  for (const PartitionRoleRecord& r : logs.partition_roles) {
    ++s.role_records;
    if (r.role != "leader" || r.epoch <= 0) continue;
    led[{r.partition, r.epoch}].emplace(r.node, &r);
    partitions_led.insert(r.partition);
  }
  s.epochs_led = static_cast<int64_t>(led.size());
  s.partitions_led = static_cast<int64_t>(partitions_led.size());
  for (const auto& [at, by_node] : led) {
    if (by_node.size() < 2) continue;
    std::vector<std::string> who;
    for (const auto& [node, record] : by_node) who.push_back(DescribeRole(*record));
    violate(ViolationKind::kTwoWritersInEpoch,
            absl::StrCat("partition ", at.first, " epoch ", at.second, " was led by ",
                         absl::StrJoin(who, " and ")));
  }

  // (b) A (partition, seq, epoch) names one entry on every node that holds it. One seq of two
  // epochs is no violation: a new leader replaces what older epochs left uncommitted.
  std::map<std::tuple<uint32_t, uint64_t, int64_t>, std::map<std::string, std::string>> holders;
  for (const ReplicaLogEntry& e : logs.replica_entries) {
    holders[{e.partition, e.seq, e.epoch}].emplace(e.node, e.digest);  // a repeat is (c)'s
  }
  s.replica_entries = static_cast<int64_t>(logs.replica_entries.size());
  for (const auto& [at, by_node] : holders) {
    if (by_node.size() < 2) continue;
    ++s.entries_compared;
    std::set<std::string> digests;
    for (const auto& [node, digest] : by_node) digests.insert(digest);
    if (digests.size() < 2) continue;
    std::vector<std::string> who;
    for (const auto& [node, digest] : by_node) who.push_back(absl::StrCat(node, " ", digest));
    violate(ViolationKind::kTwoWritersInEpoch,
            absl::StrCat("partition ", std::get<0>(at), " seq ", std::get<1>(at), " epoch ",
                         std::get<2>(at), " holds different entries: ", absl::StrJoin(who, ", ")));
  }

  // (c) Each node's log of each partition: the seqs (base, end] each once, in order, epochs
  // never going back (replica_storage.h's Append).
  std::map<std::pair<std::string, uint32_t>, std::vector<const ReplicaLogEntry*>> by_log;
  for (const ReplicaLogEntry& e : logs.replica_entries) by_log[{e.node, e.partition}].push_back(&e);
  s.replica_logs = static_cast<int64_t>(logs.replica_logs.size());
  for (const ReplicaLogHeader& h : logs.replica_logs) {
    const std::string name = absl::StrCat(h.node, "'s log of partition ", h.partition);
    if (h.applied_seq < h.base_seq || h.applied_seq > h.end_seq) {
      violate(ViolationKind::kLogOrder,
              absl::StrCat(name, ": applied ", h.applied_seq, " lies outside (base ", h.base_seq,
                           ", end ", h.end_seq, "]"));
    }
    std::vector<const ReplicaLogEntry*>& entries = by_log[{h.node, h.partition}];
    std::stable_sort(
        entries.begin(), entries.end(),
        [](const ReplicaLogEntry* a, const ReplicaLogEntry* b) { return a->seq < b->seq; });
    uint64_t last_seq = h.base_seq;
    int64_t last_epoch = h.base_epoch;
    std::string last = absl::StrCat("the base ", h.base_seq, "/", h.base_epoch);
    for (const ReplicaLogEntry* e : entries) {
      std::vector<std::string> problems;
      if (e->seq != last_seq + 1) problems.push_back("its seq does not follow");
      if (e->epoch < last_epoch) problems.push_back("its epoch goes back");
      if (!problems.empty()) {
        violate(ViolationKind::kLogOrder,
                absl::StrCat(name, ": entry ", e->seq, "/", e->epoch, " follows ", last, " (",
                             absl::StrJoin(problems, ", "), ")"));
      }
      last_seq = e->seq;
      last_epoch = e->epoch;
      last = absl::StrCat("entry ", e->seq, "/", e->epoch);
    }
    if (last_seq != h.end_seq) {
      violate(ViolationKind::kLogOrder, absl::StrCat(name, ": its header says end ", h.end_seq,
                                                     ", its last entry is ", last));
    }
  }
}

const char* CauseName(RerunCause cause) {
  switch (cause) {
    case RerunCause::kIntendedRetry:
      return "intended failure / retry";
    case RerunCause::kTimedOut:
      return "run-time limit (slow job timed out)";
    case RerunCause::kWorkerKill:
      return "worker SIGKILL";
    case RerunCause::kWorkerStop:
      return "worker SIGSTOP (lease expiry)";
    case RerunCause::kBrokerCrash:
      return "broker crash between lease and ack";
    case RerunCause::kClusterFault:
      return "cluster fault (node, network, etcd, disk or clock)";
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
    if (std::string problem = FaultProblem(e, logs.driver_events); !problem.empty()) {
      Malformed(absl::StrCat("driver (", problem, ")"), line, logs);
      continue;
    }
    logs.driver_events.push_back(std::move(e));
  }
}

void ParseNodeLog(absl::string_view node, absl::string_view text, CrashLogs& logs) {
  const std::string where = absl::StrCat("node log ", node);
  for (absl::string_view line : CompleteLines(text, logs)) {
    std::map<std::string, std::string> fields;
    if (!ParseFlatJsonObject(line, fields)) {
      // Another program's line (gRPC's, RocksDB's): skipped, unless it claims to be the event
      // this check reads (the text log format, say, which the check cannot read).
      if (absl::StrContains(line, "partition_role")) Malformed(where, line, logs);
      continue;
    }
    if (auto event = fields.find("event");
        event == fields.end() || event->second != "partition_role") {
      continue;
    }
    PartitionRoleRecord r;
    r.log = std::string(node);
    if (!RoleRecordOf(fields, r)) {
      Malformed(where, line, logs);
      continue;
    }
    logs.partition_roles.push_back(std::move(r));
  }
}

void ParseReplicaLogDump(absl::string_view node, absl::string_view text, CrashLogs& logs) {
  const std::string where = absl::StrCat("log dump ", node);
  int64_t partition = -1;  // the one of the last header; -1 before it or after a bad one
  std::set<uint32_t> headers;
  for (absl::string_view line : CompleteLines(text, logs)) {
    if (absl::StartsWith(line, "#")) {
      ReplicaLogHeader h;
      h.node = std::string(node);
      partition = -1;
      if (!ParseDumpHeader(line, h) || !headers.insert(h.partition).second) {
        Malformed(where, line, logs);
        continue;
      }
      partition = h.partition;
      logs.replica_logs.push_back(std::move(h));
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    ReplicaLogEntry e;
    e.node = std::string(node);
    if (f.size() != 4 || !ToUint(f[0], &e.partition) || !ToUint(f[1], &e.seq) ||
        !ToInt(f[2], &e.epoch) || !IsHexDigest(f[3]) ||
        partition != static_cast<int64_t>(e.partition)) {
      Malformed(where, line, logs);
      continue;
    }
    e.digest = std::string(f[3]);
    logs.replica_entries.push_back(std::move(e));
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
    case ViolationKind::kTwoWritersInEpoch:
      return "TWO_WRITERS_IN_EPOCH";
    case ViolationKind::kLogOrder:
      return "LOG_ORDER";
    case ViolationKind::kDependencyOrder:
      return "DEPENDENCY_ORDER";
    case ViolationKind::kScheduleRunTwice:
      return "SCHEDULE_RUN_TWICE";
    case ViolationKind::kScheduleRunMissed:
      return "SCHEDULE_RUN_MISSED";
  }
  return "?";
}

namespace {

// The schedule's runs (kScheduledQueue's jobs): one job per run time, and no gap between two
// consecutive runs that no downtime explains.
template <typename Violate>
void CheckScheduleRuns(const CrashLogs& logs, const std::vector<const v1::Job*>& jobs, Summary& s,
                       Violate violate) {
  constexpr int64_t kSecond = 1'000'000;
  constexpr int64_t kHealSlack = 10 * kSecond;
  // When runs may be missed: [from, to] in microseconds.
  std::vector<std::pair<int64_t, int64_t>> down;
  std::map<std::string, int64_t> open;  // fault id, or node, -> its start
  int64_t broker_killed = -1;
  for (const DriverEvent& e : logs.driver_events) {
    switch (e.type) {
      case DriverEventType::kBrokerKill:
        broker_killed = e.ts;
        break;
      case DriverEventType::kBrokerUp:
        if (broker_killed >= 0) down.emplace_back(broker_killed - kSecond, e.ts + kSecond);
        broker_killed = -1;
        break;
      case DriverEventType::kFault:
        open[absl::StrCat("fault ", e.value)] = e.ts;
        break;
      case DriverEventType::kHeal:
        if (auto it = open.find(absl::StrCat("fault ", e.value)); it != open.end()) {
          down.emplace_back(it->second - kSecond, e.ts + kHealSlack);
          open.erase(it);
        }
        break;
      case DriverEventType::kNodeKill:
      case DriverEventType::kNodeStop:
      case DriverEventType::kNodePause:
        open.emplace(absl::StrCat("node ", e.subject), e.ts);
        break;
      case DriverEventType::kNodeUp:
      case DriverEventType::kNodeCont:
        if (auto it = open.find(absl::StrCat("node ", e.subject)); it != open.end()) {
          down.emplace_back(it->second - kSecond, e.ts + kHealSlack);
          open.erase(it);
        }
        break;
      default:
        break;
    }
  }
  if (broker_killed >= 0)
    down.emplace_back(broker_killed - kSecond, std::numeric_limits<int64_t>::max());
  for (const auto& [what, from] : open)
    down.emplace_back(from - kSecond, std::numeric_limits<int64_t>::max());

  std::map<int64_t, std::vector<std::string>> runs;  // run time (µs) -> job ids
  const std::string prefix = absl::StrCat(kScheduleId, "@");
  for (const v1::Job* job : jobs) {
    absl::Time at;
    std::string error;
    if (!absl::StartsWith(job->dedup_key(), prefix) ||
        !absl::ParseTime(absl::RFC3339_full, job->dedup_key().substr(prefix.size()), &at, &error)) {
      violate(ViolationKind::kUnknownJob, job->id(),
              absl::StrCat("a job of ", kScheduledQueue, " with dedup key '", job->dedup_key(),
                           "', which names no run of ", kScheduleId));
      continue;
    }
    runs[absl::ToUnixMicros(at)].push_back(job->id());
  }
  s.schedule_runs = static_cast<int64_t>(runs.size());
  int64_t previous = -1;
  for (const auto& [at, ids] : runs) {
    if (ids.size() > 1) {
      violate(ViolationKind::kScheduleRunTwice, ids.front(),
              absl::StrCat("run ", at, " of ", kScheduleId, " is jobs ", absl::StrJoin(ids, ", ")));
    }
    if (previous >= 0 && at - previous > kSecond) {
      const int64_t run = at;  // a structured binding cannot be captured before C++20's clang 16
      const bool explained = std::any_of(down.begin(), down.end(), [&](const auto& w) {
        return w.first < run && previous < w.second;
      });
      if (explained) {
        ++s.schedule_gaps;
      } else {
        violate(ViolationKind::kScheduleRunMissed, ids.front(),
                absl::StrCat("runs of ", kScheduleId, " at ", previous, " and ", at, " are ",
                             (at - previous) / 1000, " ms apart, with no kill or fault between"));
      }
    }
    previous = at;
  }
}

}  // namespace

Report Check(const CrashLogs& logs, const std::vector<v1::Job>& all_final_jobs) {
  // The schedule's runs are checked on their own; the rest against the producers' enqueues.
  std::vector<v1::Job> final_jobs;
  std::vector<const v1::Job*> scheduled;
  for (const v1::Job& job : all_final_jobs) {
    if (job.queue() == kScheduledQueue) {
      scheduled.push_back(&job);
    } else {
      final_jobs.push_back(job);
    }
  }
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
    if (e->kind == kKindSlow) ++s.jobs_by_kind_slow;
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
  s.cluster_faults = static_cast<int64_t>(timeline.faults.size());
  for (const Stop& f : timeline.faults) {
    if (f.to == std::numeric_limits<int64_t>::max()) ++s.cluster_faults_unhealed;
  }
  for (const DriverEvent& e : logs.driver_events) {
    if (e.type == DriverEventType::kFault) ++s.faults_by_kind[e.subject];
  }
  for (const auto& [instance, kills] : timeline.worker_kills) s.worker_kills += kills.size();
  for (const auto& [instance, stops] : timeline.worker_stops) s.worker_stops += stops.size();
  for (RerunCause c :
       {RerunCause::kIntendedRetry, RerunCause::kTimedOut, RerunCause::kWorkerKill,
        RerunCause::kWorkerStop, RerunCause::kBrokerCrash, RerunCause::kUnexplained}) {
    s.reruns[c] = 0;
  }
  if (s.cluster_faults > 0) s.reruns[RerunCause::kClusterFault] = 0;

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
                "ran again (", Describe(next), ") after ", Describe(prev), " with no kill, stop, ",
                timeline.faults.empty() ? "" : "cluster fault, ",
                "broker crash or intended failure in between; broker recorded that attempt as ",
                record == nullptr ? "(no record)" : v1::AttemptOutcome_Name(record->outcome())));
      }
    }
  }

  CheckWriters(logs, s, [&violate](ViolationKind kind, std::string detail) {
    violate(kind, "", std::move(detail));
  });
  // A job that waited for others (the producers' batches): each of them completed, and no
  // attempt of it started before the last of them did. Both times are stamped by the wall clock
  // of the node that wrote them, and the clock-skew nemesis restarts a node with its clock off by
  // up to its skew: a start stamped by one node and a completion by another may then look out of
  // order by up to two skews (seed 816933868: a dependency completed on one node at 92.22 s, its
  // dependent's start stamped 90.62 s by a node 2 s behind, while the worker logs show the start
  // after the completion). Without a skew the times are compared as they are.
  int64_t clock_slack_us = 0;
  for (const DriverEvent& e : logs.driver_events) {
    if (e.type == DriverEventType::kNodeSkew)
      clock_slack_us = std::max(clock_slack_us, 2 * std::abs(e.value) * 1'000'000);
  }
  for (const v1::Job& job : final_jobs) {
    if (job.depends_on().empty()) continue;
    ++s.dependents;
    for (const std::string& dep_id : job.depends_on()) {
      auto dep = final_by_id.find(dep_id);
      if (dep == final_by_id.end() || dep->second->state() != v1::JOB_STATE_COMPLETED) {
        violate(ViolationKind::kDependencyOrder, job.id(),
                absl::StrCat("its dependency ", dep_id, " is ",
                             dep == final_by_id.end() ? "missing"
                                                      : v1::JobState_Name(dep->second->state())));
        continue;
      }
      if (dep->second->queue() != job.queue()) ++s.dependents_across_queues;
      const int64_t completed = Micros(dep->second->completed_at());
      for (const v1::AttemptRecord& a : job.attempts()) {
        if (Micros(a.started_at()) + clock_slack_us < completed) {
          violate(
              ViolationKind::kDependencyOrder, job.id(),
              absl::StrCat("attempt ", a.attempt(), " started at ", Micros(a.started_at()),
                           ", before its dependency ", dep_id, " completed at ", completed,
                           clock_slack_us > 0 ? absl::StrCat(" (by more than the ", clock_slack_us,
                                                             " us that skewed clocks allow)")
                                              : ""));
        }
      }
    }
  }
  CheckScheduleRuns(logs, scheduled, s, violate);
  return report;
}

std::string Report::SummaryTable(
    const std::vector<std::pair<std::string, std::string>>& extra) const {
  const Summary& s = summary;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"jobs enqueued (acknowledged ids)", absl::StrCat(s.jobs_enqueued)},
      {"  kinds ok / flaky / perm / exhaust / slow",
       absl::StrCat(s.jobs_by_kind_ok, " / ", s.jobs_by_kind_flaky, " / ", s.jobs_by_kind_perm,
                    " / ", s.jobs_by_kind_exhaust, " / ", s.jobs_by_kind_slow)},
      {"  single enqueues", absl::StrCat(s.single_enqueues)},
      {"  batches (jobs in them)", absl::StrCat(s.batches, " (", s.jobs_in_batches, ")")},
      {"  enqueues acknowledged after a retry", absl::StrCat(s.enqueues_retried)},
      {"  dedup hits after crash", absl::StrCat(s.dedup_hits_after_crash)},
      {"broker kills (SIGKILL)", absl::StrCat(s.broker_kills)},
  };
  // The cluster harness's rows, only where it ran: a crash harness run prints what it did.
  const bool cluster = s.cluster_faults > 0 || s.role_records > 0 || s.replica_logs > 0;
  if (cluster) {
    rows.push_back({"cluster faults injected (never healed)",
                    absl::StrCat(s.cluster_faults, " (", s.cluster_faults_unhealed, ")")});
    for (const auto& [kind, n] : s.faults_by_kind) {
      rows.push_back({absl::StrCat("  faults: ", kind), absl::StrCat(n)});
    }
  }
  rows.insert(rows.end(),
              {
                  {"worker kills (SIGKILL)", absl::StrCat(s.worker_kills)},
                  {"worker stops (SIGSTOP > lease)", absl::StrCat(s.worker_stops)},
                  {"jobs received by workers (runs)", absl::StrCat(s.runs)},
                  {"  jobs run more than once", absl::StrCat(s.jobs_run_more_than_once)},
              });
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
          {"jobs that waited for another (depends_on)", absl::StrCat(s.dependents)},
          {"  of them for a job of another queue", absl::StrCat(s.dependents_across_queues)},
          {"schedule runs (gaps explained by downtime)",
           absl::StrCat(s.schedule_runs, " (", s.schedule_gaps, ")")},
      });
  if (cluster) {
    rows.insert(
        rows.end(),
        {
            {"partition_role events read (node logs)", absl::StrCat(s.role_records)},
            {"partitions / epochs led", absl::StrCat(s.partitions_led, " / ", s.epochs_led)},
            {"replication logs dumped (entries)",
             absl::StrCat(s.replica_logs, " (", s.replica_entries, ")")},
            {"  entries compared across nodes", absl::StrCat(s.entries_compared)},
        });
  }
  rows.insert(rows.end(), {
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
