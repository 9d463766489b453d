#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "core/job.h"

namespace jobbroker::core {

// Dedup keys: which job holds each (queue, key) and until when. A key holds while its job runs
// and at least until its TTL has passed; the entry outlives a job removed by retention until then,
// so a late duplicate is still answered with the old job. Entries are kept in expiry order so
// the ticker frees them in time.
//
// Not thread-safe (the broker's mutex guards it).
class DedupTable {
 public:
  using Key = std::pair<std::string, std::string>;  // (queue, dedup key)

  // The entry holding `key` in `queue`, or nullptr. It may have expired: the caller decides
  // whether it still holds (its job may still run).
  const DedupEntry* Find(const std::string& queue, const std::string& key) const;
  bool Contains(const std::string& queue, const std::string& key) const {
    return Find(queue, key) != nullptr;
  }
  // Makes `entry` the holder of its key, replacing an earlier entry and its expiry.
  void Put(DedupEntry entry);

  // Frees entries whose TTL has passed, earliest first, at most `budget` (decremented per entry
  // looked at). An entry whose job still runs (`job_running` says so of its job id) is looked at
  // again a minute later: the key holds until its job ends (Enqueue checks that itself), so this
  // only frees memory and need not be prompt. Returns the keys freed, for the store.
  std::vector<Key> Expire(absl::Time now, int& budget,
                          absl::FunctionRef<bool(const std::string& job_id)> job_running);

  // When the earliest entry expires; InfiniteFuture if there is none.
  absl::Time NextExpiry() const;

  size_t size() const { return entries_.size(); }
  void Clear();

 private:
  absl::flat_hash_map<Key, DedupEntry> entries_;
  absl::btree_set<std::tuple<absl::Time, std::string, std::string>> expiry_;
};

}  // namespace jobbroker::core
