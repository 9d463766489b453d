package jobbroker

// Where a queue and a job live in a cluster of count partitions, computed by the client so
// that it can send a call straight to the partition's leader.
//
// Both functions must answer exactly what the broker answers (core/ids.cc places queues and
// names job ids by the same rules): the test reads tests/client/partition_vectors.tsv, whose
// every line the broker's own test checks against core, so neither side can drift.

// partitionOfQueue is FNV-1a (64 bits) of the queue name's UTF-8 bytes, modulo count; 0 when
// count is 0 or 1.
func partitionOfQueue(queue string, count uint32) uint32 {
	if count <= 1 {
		return 0
	}
	const offsetBasis, prime = 0xcbf29ce484222325, 0x100000001b3
	var hash uint64 = offsetBasis
	for i := 0; i < len(queue); i++ { // bytes, not runes: the broker hashes the UTF-8 bytes
		hash = (hash ^ uint64(queue[i])) * prime
	}
	return uint32(hash % uint64(count))
}

// A job id is 26 characters of Crockford base32 (upper case, without I, L, O, U); characters
// [10, 13) hold its partition, 5 bits each, most significant first.
const (
	jobIDChars          = 26
	partitionFirstChar  = 10
	partitionFieldChars = 3
	crockfordDigits     = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
)

// partitionOfJobID is the partition field of jobID modulo count (0 when count is 0 or 1); ok is
// false unless jobID has the broker's form, whose first character is at most '7' (26 digits
// carry 130 bits of which the top 2 are zero).
func partitionOfJobID(jobID string, count uint32) (partition uint32, ok bool) {
	if len(jobID) != jobIDChars {
		return 0, false
	}
	var field uint32
	for i := 0; i < len(jobID); i++ {
		value := crockfordValue(jobID[i])
		if value < 0 || (i == 0 && value >= 8) {
			return 0, false
		}
		if i >= partitionFirstChar && i < partitionFirstChar+partitionFieldChars {
			field = field<<5 | uint32(value)
		}
	}
	if count <= 1 {
		return 0, true
	}
	return field % count, true
}

// crockfordValue is the 5-bit value of a digit as the broker writes job ids, or -1.
func crockfordValue(c byte) int {
	for i := 0; i < len(crockfordDigits); i++ {
		if crockfordDigits[i] == c {
			return i
		}
	}
	return -1
}
