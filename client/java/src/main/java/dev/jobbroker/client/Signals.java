package dev.jobbroker.client;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** Catches SIGTERM and SIGINT so that a worker can stop gracefully and main can return 0. */
final class Signals {
  private static final Logger log = LoggerFactory.getLogger(Signals.class);

  private Signals() {}

  /**
   * Runs {@code action} on SIGTERM or SIGINT instead of the JVM's default (which runs shutdown
   * hooks, then exits 143 or 130). Falls back to shutdown hooks where signals cannot be caught.
   */
  static void onTermination(Runnable action) {
    for (String name : new String[] {"TERM", "INT"}) {
      try {
        sun.misc.Signal.handle(new sun.misc.Signal(name), sig -> action.run());
      } catch (IllegalArgumentException | UnsupportedOperationException e) {
        log.debug("cannot catch SIG{}: {}", name, e.getMessage());
      }
    }
  }
}
