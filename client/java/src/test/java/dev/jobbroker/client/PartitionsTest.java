package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.OptionalInt;
import org.junit.jupiter.api.Test;

/** Partitions answers every line of tests/client/partition_vectors.tsv, as the broker does. */
class PartitionsTest {
  @Test
  void everyVectorOfTheRepositoryMatches() throws Exception {
    Path vectors = BrokerProcess.repoRoot().resolve("tests/client/partition_vectors.tsv");
    List<String> lines = Files.readAllLines(vectors);
    int checked = 0;
    for (String line : lines) {
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      String[] f = line.split("\t", -1);
      assertEquals(4, f.length, "malformed vector line: " + line);
      int count = Integer.parseInt(f[2]);
      switch (f[0]) {
        case "queue" -> assertEquals(Integer.parseInt(f[3]), Partitions.ofQueue(f[1], count), line);
        case "job" -> {
          OptionalInt want =
              f[3].equals("none") ? OptionalInt.empty() : OptionalInt.of(Integer.parseInt(f[3]));
          assertEquals(want, Partitions.ofJobId(f[1], count), line);
        }
        default -> throw new AssertionError("unknown vector kind: " + line);
      }
      checked++;
    }
    assertTrue(checked > 100, "only " + checked + " vectors in " + vectors);
  }
}
