package dev.jobbroker.client;

import java.nio.charset.StandardCharsets;
import java.util.OptionalInt;

/**
 * Where a queue and a job live in a cluster of {@code count} partitions, computed by the client
 * so that it can send a call straight to the partition's leader.
 *
 * <p>Both functions must answer what the broker's own placement answers (core/ids.cc): the
 * broker puts queues and names job ids by it. The client cannot link the broker's code, so the
 * rule is written again here; {@code tests/client/partition_vectors.tsv}, checked against the
 * broker by a C++ test, is what {@code PartitionsTest} holds this copy to.
 */
final class Partitions {
  private static final long FNV_OFFSET_BASIS = 0xcbf29ce484222325L;
  private static final long FNV_PRIME = 0x100000001b3L;

  private static final int JOB_ID_CHARS = 26;
  // Characters [10, 13) of a job id hold its partition, 5 bits each, most significant first.
  private static final int PARTITION_FIRST_CHAR = 10;
  private static final int PARTITION_CHARS = 3;
  // Crockford base32 as the broker writes it: upper case, no I, L, O, U.
  private static final String BASE32_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

  private Partitions() {}

  /** FNV-1a (64 bits) of the queue name's UTF-8 bytes, modulo {@code count}; 0 if count <= 1. */
  static int ofQueue(String queue, int count) {
    if (count <= 1) {
      return 0;
    }
    long hash = FNV_OFFSET_BASIS;
    for (byte b : queue.getBytes(StandardCharsets.UTF_8)) {
      hash = (hash ^ (b & 0xff)) * FNV_PRIME;
    }
    return (int) Long.remainderUnsigned(hash, count);
  }

  /**
   * The partition field of a job id modulo {@code count} (0 if count <= 1); empty unless the id
   * has the broker's form: 26 characters of {@value #BASE32_DIGITS}, the first at most '7'.
   */
  static OptionalInt ofJobId(String jobId, int count) {
    if (jobId.length() != JOB_ID_CHARS) {
      return OptionalInt.empty();
    }
    int field = 0;
    for (int i = 0; i < JOB_ID_CHARS; i++) {
      int value = BASE32_DIGITS.indexOf(jobId.charAt(i));
      // 26 digits carry 130 bits, of which the top 2 are zero: the first digit is below 8.
      if (value < 0 || (i == 0 && value >= 8)) {
        return OptionalInt.empty();
      }
      if (i >= PARTITION_FIRST_CHAR && i < PARTITION_FIRST_CHAR + PARTITION_CHARS) {
        field = (field << 5) | value;
      }
    }
    return OptionalInt.of(count <= 1 ? 0 : field % count);
  }
}
