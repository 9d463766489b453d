// Where a queue and a job live in a cluster of `count` partitions, computed by the client so that
// it can send a call straight to the partition's leader.
//
// Both functions must answer what the broker answers (core/ids.cc): it places queues and names
// job ids by that rule. tests/client/partition_vectors.tsv holds lines checked against the
// broker's own code; test/routing.test.ts checks these functions against every one of them.

const fnvOffsetBasis = 0xcbf29ce484222325n;
const fnvPrime = 0x100000001b3n;
const uint64Mask = (1n << 64n) - 1n;

/** FNV-1a (64 bits) of the queue name's UTF-8 bytes, modulo `count`; 0 when `count` <= 1. */
export function partitionOfQueue(queue: string, count: number): number {
  if (count <= 1) return 0;
  let hash = fnvOffsetBasis;
  for (const byte of Buffer.from(queue, "utf8")) {
    hash = ((hash ^ BigInt(byte)) * fnvPrime) & uint64Mask;
  }
  return Number(hash % BigInt(count));
}

// Crockford base32 as the broker writes job ids: upper case, no I, L, O or U.
const base32Digits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const jobIdChars = 26;
// Characters [10, 13) of a job id hold its partition, 5 bits each, most significant first.
const partitionFirstChar = 10;
const partitionChars = 3;

/**
 * The partition field of a job id, modulo `count` (0 when `count` <= 1); undefined unless
 * `jobId` has the broker's form: 26 characters of the base32 alphabet, the first below '8'
 * (26 digits carry 130 bits of which the top 2 are zero).
 */
export function partitionOfJobId(jobId: string, count: number): number | undefined {
  if (jobId.length !== jobIdChars) return undefined;
  let field = 0;
  for (let i = 0; i < jobId.length; i++) {
    const value = base32Digits.indexOf(jobId[i]);
    if (value < 0 || (i === 0 && value >= 8)) return undefined;
    if (i >= partitionFirstChar && i < partitionFirstChar + partitionChars) field = field * 32 + value;
  }
  return count <= 1 ? 0 : field % count;
}
