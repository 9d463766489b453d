#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "cluster/replication/replica_storage.h"
#include "core/store.h"

namespace jobbroker::cluster {

// What replicas of one partition say to each other (CLUSTER.md "What is replicated"). Between
// processes these travel over one gRPC stream per node pair; in the simulator, over its bus,
// which may drop, repeat, delay and reorder them: nothing here relies on delivery or order.

// Leader -> follower: the entries after `prev`, and how far the leader has committed. Empty
// `entries` is a heartbeat (it still carries the commit and the epoch).
struct AppendRequest {
  int64_t epoch = 0;
  LogPosition prev;  // the entry just before entries[0]; must match the follower's log
  std::vector<LogEntry> entries;
  uint64_t commit_seq = 0;
};

// Leader -> follower, for a follower that needs entries the leader no longer stores: chunk
// `index` of the leader's state as of `at`. The follower installs it after the `last` chunk.
struct SnapshotChunk {
  int64_t epoch = 0;
  LogPosition at;
  uint64_t index = 0;
  bool last = false;
  core::Transition records;  // puts only
};

// Follower -> leader, to an AppendRequest or the last SnapshotChunk.
struct AppendResponse {
  // The epoch of the request answered, or the follower's floor when it refused it as stale.
  int64_t epoch = 0;
  enum class Result {
    kMatched,     // its log equals the leader's through match_seq (durably)
    kMismatch,    // prev did not match: send again from retry_from
    kStaleEpoch,  // the request's epoch is below the follower's floor
  };
  Result result = Result::kMatched;
  uint64_t match_seq = 0;
  uint64_t retry_from = 0;
};

// Follower -> leader, for every SnapshotChunk but the last: the next chunk it wants.
struct SnapshotAck {
  int64_t epoch = 0;
  LogPosition at;
  uint64_t next_index = 0;
};

struct ReplicationMessage {
  std::string from;  // node ids
  std::string to;
  uint32_t partition = 0;
  std::variant<AppendRequest, SnapshotChunk, AppendResponse, SnapshotAck> body;
};

}  // namespace jobbroker::cluster
