"""Where a queue and a job live in a cluster of `count` partitions.

The client computes these to send a call straight to the leader of the partition. They must
answer exactly what the broker answers (core/ids.cc places queues and names job ids by the same
rules); tests/test_partition.py checks them against every line of the repository's
tests/client/partition_vectors.tsv, which a C++ test checks against the broker's own code.
"""

from __future__ import annotations

__all__ = ["partition_of_queue", "partition_of_job_id"]

_FNV_OFFSET_BASIS = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_UINT64 = (1 << 64) - 1

# Job ids are 26 characters of Crockford base32 as the broker writes them: upper case, no I, L,
# O, U. Characters [10, 13) hold the partition, 5 bits each, most significant first.
_BASE32_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_BASE32_VALUE = {digit: value for value, digit in enumerate(_BASE32_DIGITS)}
_JOB_ID_CHARS = 26
_PARTITION_FIELD = slice(10, 13)


def partition_of_queue(queue: str, count: int) -> int:
    """FNV-1a (64 bits) of the queue name's UTF-8 bytes, modulo `count`; 0 when `count` <= 1."""
    if count <= 1:
        return 0
    fnv = _FNV_OFFSET_BASIS
    for byte in queue.encode("utf-8"):
        fnv = ((fnv ^ byte) * _FNV_PRIME) & _UINT64
    return fnv % count


def partition_of_job_id(job_id: str, count: int) -> int | None:
    """The partition field of `job_id` modulo `count` (0 when `count` <= 1); None unless the id
    has the broker's form: 26 characters of the alphabet, the first below '8' (26 characters
    carry 130 bits, of which the top 2 are zero)."""
    if len(job_id) != _JOB_ID_CHARS:
        return None
    values = [_BASE32_VALUE.get(c, -1) for c in job_id]
    if min(values) < 0 or values[0] >= 8:
        return None
    if count <= 1:
        return 0
    field = 0
    for value in values[_PARTITION_FIELD]:
        field = (field << 5) | value
    return field % count
