#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace jobbroker::crash {

struct ProducerOptions {
  std::string address;   // the broker, "127.0.0.1:PORT", or a cluster's nodes, comma-separated
  std::string log_path;  // one ENQ line per acknowledged job (checker.h)
  std::string name;      // prefix of every dedup key; unique per producer of a run
  int jobs = 0;
  uint64_t seed = 0;
  // Spread the calls over about this long (the kill phase): each pause is the time left over
  // the calls left, so time lost to a broker that is down is made up.
  absl::Duration spread = absl::ZeroDuration();
  std::vector<std::string> queues;
};

// Enqueues `jobs` jobs, each with its own dedup key, singly or in batches, retrying each call
// (same keys, same payloads) on UNAVAILABLE and other connection errors until the broker answers
// it, as a real producer must. Exit code: 0 when all were acknowledged; 2 on an answer that no
// retry can fix (a harness bug), after printing it.
int RunProducer(const ProducerOptions& options);

}  // namespace jobbroker::crash
