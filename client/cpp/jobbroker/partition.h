#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace jobbroker::client {

// Where a queue and a job live in a cluster of `count` partitions, computed by the client so
// that it can send a call straight to the partition's leader.
//
// These two functions must answer exactly what core::PartitionOfQueue and
// core::PartitionOfJobId (core/ids.cc) answer: the broker places queues and names job ids by
// those. They are written again here because the client library links only the wire contract,
// never core/; tests/client/partition_test.cc checks that both agree.

// FNV-1a (64 bits) of the queue's name, modulo `count`; 0 when `count` is 0 or 1.
uint32_t PartitionOfQueue(std::string_view queue, uint32_t count);

// The partition field of a job id (characters 11 to 13 of the 26 of Crockford base32),
// modulo `count`; 0 when `count` is 0 or 1. nullopt unless `job_id` has the broker's form: 26
// characters of the alphabet "0123456789ABCDEFGHJKMNPQRSTVWXYZ" (upper case), the first at
// most '7'.
std::optional<uint32_t> PartitionOfJobId(std::string_view job_id, uint32_t count);

}  // namespace jobbroker::client
