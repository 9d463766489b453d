//! Where a queue and a job live in a cluster of `count` partitions, computed by the client so
//! that it sends each call straight to the partition's leader.
//!
//! Both functions must answer what the broker itself answers (`core/ids.cc`): it places
//! queues and names job ids by the same rules. The repository's
//! `tests/client/partition_vectors.tsv`, checked against the broker's code, pins them.

/// A job id is 26 Crockford base32 characters (130 bits, of which the top 2 are zero).
const JOB_ID_CHARS: usize = 26;
/// Characters `10..13` of a job id hold its partition, 5 bits each, most significant first.
const PARTITION_CHARS: std::ops::Range<usize> = 10..13;
/// The broker's Crockford base32 digits (upper case; no I, L, O, U).
const BASE32_DIGITS: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The partition of `queue`: FNV-1a (64 bits) of its UTF-8 bytes, modulo `count`; 0 when
/// `count` is 0 or 1.
pub fn partition_of_queue(queue: &str, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let hash = queue.bytes().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    });
    // The remainder is below `count`, a u32.
    (hash % u64::from(count)) as u32
}

/// The partition of the job `job_id`: its partition field modulo `count` (0 when `count` is 0
/// or 1). `None` unless the id has the broker's form: 26 characters of
/// `0123456789ABCDEFGHJKMNPQRSTVWXYZ`, the first below `8`.
pub fn partition_of_job_id(job_id: &str, count: u32) -> Option<u32> {
    let bytes = job_id.as_bytes();
    if bytes.len() != JOB_ID_CHARS {
        return None;
    }
    let mut field = 0u32;
    for (at, &byte) in bytes.iter().enumerate() {
        let value = BASE32_DIGITS.iter().position(|&d| d == byte)? as u32;
        if at == 0 && value >= 8 {
            return None;
        }
        if PARTITION_CHARS.contains(&at) {
            field = (field << 5) | value;
        }
    }
    Some(if count <= 1 { 0 } else { field % count })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of the repository's vectors file, checked against the broker's own code.
    #[test]
    fn every_line_of_the_partition_vectors_file_holds() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/client/partition_vectors.tsv");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let (mut queues, mut jobs) = (0, 0);
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "malformed line {line:?}");
            let count: u32 = fields[2].parse().unwrap();
            match fields[0] {
                "queue" => {
                    let want: u32 = fields[3].parse().unwrap();
                    assert_eq!(partition_of_queue(fields[1], count), want, "{line:?}");
                    queues += 1;
                }
                "job" => {
                    let want = (fields[3] != "none").then(|| fields[3].parse::<u32>().unwrap());
                    assert_eq!(partition_of_job_id(fields[1], count), want, "{line:?}");
                    jobs += 1;
                }
                kind => panic!("unknown kind {kind:?} in {line:?}"),
            }
        }
        assert!(
            queues > 0 && jobs > 0,
            "{queues} queue and {jobs} job lines"
        );
    }
}
