import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.JobContext;
import dev.jobbroker.client.Json;
import dev.jobbroker.client.PermanentError;
import dev.jobbroker.client.RetryAfter;
import dev.jobbroker.client.Snooze;
import dev.jobbroker.client.Worker;
import io.grpc.StatusRuntimeException;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * The Java conformance worker of tests/interop/CONFORMANCE.md: one handler per --queues entry,
 * each doing what its job's payload "action" says and writing events for the harness.
 */
public final class ConformanceWorker {
  private final Map<String, String> flags;
  private final FileOutputStream events;
  private final String langName;
  // Jobs this process snoozed once already (the "snooze" action snoozes only the first time).
  private final Set<String> snoozed = ConcurrentHashMap.newKeySet();

  private ConformanceWorker(Map<String, String> flags) throws IOException {
    this.flags = flags;
    this.events = new FileOutputStream(required("events"), true);
    this.langName = flags.getOrDefault("lang-name", "java");
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = parse(args);
    ConformanceWorker w = new ConformanceWorker(flags);
    int status = w.run();
    System.exit(status);
  }

  private int run() throws Exception {
    try (JobBrokerClient client = JobBrokerClient.connect(clientOptions())) {
      Worker worker =
          Worker.builder(client)
              .concurrency(intFlag("concurrency", 1))
              .prefetch(intFlag("prefetch", 0))
              .leaseDuration(Duration.ofMillis(intFlag("lease-ms", 0)))
              .grace(Duration.ofMillis(intFlag("grace-ms", 10000)))
              .build();
      for (String queue : required("queues").split(",")) {
        worker.handle(queue, job -> handle(job, queue));
      }
      worker.stopOnSignal();
      event(Map.of("event", "ready"));
      try {
        worker.run();
      } catch (StatusRuntimeException | IllegalStateException e) {
        System.err.println("conformance worker: " + e);
        return 1;
      }
      event(Map.of("event", "stopped"));
      return 0;
    }
  }

  /**
   * --address (one, or a cluster's nodes separated by commas, tried in order), --ca,
   * --cert/--key and --token as the library's own client options.
   */
  private ClientOptions clientOptions() {
    ClientOptions.Builder b =
        ClientOptions.builder().addresses(List.of(required("address").split(",")));
    if (flags.containsKey("ca")) {
      b.tlsCaFile(Path.of(flags.get("ca")));
    }
    if (flags.containsKey("cert") || flags.containsKey("key")) {
      b.clientCertificate(Path.of(required("cert")), Path.of(required("key")));
    }
    if (flags.containsKey("token")) {
      b.token(flags.get("token"));
    }
    return b.build();
  }

  /** The handler registered for {@code handlerQueue}. */
  private Object handle(JobContext job, String handlerQueue) throws Exception {
    Map<String, Object> event = jobEvent(job, "start");
    event.put("queue", job.queue());
    event.put("handler", handlerQueue);
    event(event);
    @SuppressWarnings("unchecked")
    Map<String, Object> p = (Map<String, Object>) job.payloadJson();
    String action = String.valueOf(p.get("action"));
    long okFrom = p.containsKey("ok_from_attempt") ? number(p, "ok_from_attempt") : Long.MAX_VALUE;
    switch (action) {
      case "ok":
        break;
      case "sleep":
        cancellably(job, () -> Thread.sleep(number(p, "ms")));
        break;
      case "wait_cancel":
        if (job.attempt() < okFrom) {
          if ("return".equals(p.get("after_cancel"))) {
            // The work was done anyway: return normally after the cancellation (acked).
            job.awaitCancellation();
            event(jobEvent(job, "cancelled"));
            break;
          }
          cancellably(job, job::awaitCancellation);
          throw new IllegalStateException("awaitCancellation returned uncancelled");
        }
        break;
      case "ignore_cancel":
        if (job.attempt() < okFrom) {
          sleepIgnoringCancellation(number(p, "ms"));
        }
        break;
      case "fail":
        if (job.attempt() < okFrom) {
          throw new RuntimeException(String.valueOf(p.get("message")));
        }
        break;
      case "permanent":
        throw new PermanentError(String.valueOf(p.get("message")));
      case "retry_after":
        if (job.attempt() == 1) {
          throw new RetryAfter(Duration.ofMillis(number(p, "ms")), String.valueOf(p.get("message")));
        }
        break;
      case "snooze":
        if (snoozed.add(job.jobId())) {
          throw new Snooze(Duration.ofMillis(number(p, "ms")));
        }
        break;
      case "progress":
        job.progress(Map.of("percent", p.get("percent")));
        Path gate = Path.of(String.valueOf(p.get("gate")));
        cancellably(
            job,
            () -> {
              while (!Files.exists(gate)) {
                Thread.sleep(20);
              }
            });
        break;
      case "steps":
        return steps(job, (List<?>) p.get("steps"));
      case "signup":
        signup(job, String.valueOf(p.get("user")));
        break;
      default:
        throw new PermanentError("unknown action " + action);
    }
    event(jobEvent(job, "done"));
    Map<String, Object> result = new LinkedHashMap<>();
    result.put("queue", handlerQueue);
    result.put("echo", p.get("echo")); // null when absent
    return result;
  }

  private Object steps(JobContext job, List<?> names) throws Exception {
    Map<String, Object> results = new LinkedHashMap<>();
    for (Object n : names) {
      String name = String.valueOf(n);
      results.put(
          name,
          job.step(
              name,
              () -> {
                Map<String, Object> e = jobEvent(job, "step");
                e.put("step", name);
                event(e);
                if (name.equals(flags.get("die-at-step"))) {
                  killSelf();
                }
                Map<String, Object> value = new LinkedHashMap<>();
                value.put("by", langName);
                value.put("step", name);
                return value;
              }));
    }
    event(jobEvent(job, "done"));
    return results;
  }

  /** The sign-up example's fake email provider (an append-only outbox file). */
  private void signup(JobContext job, String user) throws IOException {
    Path outbox = Path.of(required("outbox"));
    boolean idempotent = flags.containsKey("idempotent");
    String key = idempotent ? job.idempotencyKey() : job.jobId() + "/" + job.attempt();
    synchronized (ConformanceWorker.class) {
      boolean sent = false;
      if (idempotent && Files.exists(outbox)) {
        for (String line : Files.readAllLines(outbox, StandardCharsets.UTF_8)) {
          if (!line.isBlank()
              && key.equals(((Map<?, ?>) Json.parse(line)).get("key"))) {
            sent = true;
          }
        }
      }
      if (!sent) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("user", user);
        line.put("key", key);
        try (FileOutputStream out = new FileOutputStream(outbox.toFile(), true)) {
          out.write((Json.write(line) + "\n").getBytes(StandardCharsets.UTF_8));
        }
      }
    }
    if (user.equals(flags.get("die-after-user"))) {
      killSelf();
    }
  }

  private interface Wait {
    void run() throws InterruptedException;
  }

  /**
   * Runs {@code wait}; the job's cancellation interrupts it: writes {@code cancelled} and ends
   * the handler as cancelled (the library answers what the cancellation means).
   */
  private void cancellably(JobContext job, Wait wait) {
    try {
      wait.run();
      if (!job.isCancelled()) {
        return;
      }
    } catch (InterruptedException e) {
      // the cancellation's interrupt
    }
    event(jobEvent(job, "cancelled"));
    throw new CancellationException("cancelled: " + job.cancellation());
  }

  /** A handler stuck in a blocking call: sleeps {@code ms}, swallowing the cancel's interrupt. */
  private static void sleepIgnoringCancellation(long ms) {
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
    for (long left; (left = end - System.nanoTime()) > 0; ) {
      try {
        TimeUnit.NANOSECONDS.sleep(left);
      } catch (InterruptedException e) {
        // not looking at it
      }
    }
  }

  private static Map<String, Object> jobEvent(JobContext job, String name) {
    Map<String, Object> e = new LinkedHashMap<>();
    e.put("event", name);
    e.put("job", job.jobId());
    e.put("attempt", job.attempt());
    return e;
  }

  /** Appends one line with one write, unbuffered: the harness reads it at once. */
  private void event(Map<String, Object> e) {
    byte[] line = (Json.write(e) + "\n").getBytes(StandardCharsets.UTF_8);
    synchronized (events) {
      try {
        events.write(line);
      } catch (IOException ex) {
        throw new IllegalStateException("cannot write an event", ex);
      }
    }
  }

  private static void killSelf() {
    try {
      new ProcessBuilder("kill", "-KILL", Long.toString(ProcessHandle.current().pid()))
          .inheritIO()
          .start()
          .waitFor();
      Thread.sleep(10_000); // the signal is on its way
    } catch (IOException | InterruptedException e) {
      // no kill(1): the nearest thing, no shutdown hooks, no answers
    }
    Runtime.getRuntime().halt(137);
  }

  private static long number(Map<String, Object> p, String key) {
    return ((Number) p.get(key)).longValue();
  }

  private String required(String flag) {
    String v = flags.get(flag);
    if (v == null) {
      System.err.println("conformance worker: --" + flag + " is required");
      System.exit(2);
    }
    return v;
  }

  private int intFlag(String flag, int fallback) {
    String v = flags.get(flag);
    return v == null ? fallback : Integer.parseInt(v);
  }

  /** "--name value" pairs; "--idempotent" takes no value. */
  private static Map<String, String> parse(String[] args) {
    Map<String, String> flags = new LinkedHashMap<>();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (!a.startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + a);
      }
      String name = a.substring(2);
      int eq = name.indexOf('=');
      if (eq >= 0) {
        flags.put(name.substring(0, eq), name.substring(eq + 1));
      } else if (name.equals("idempotent")) {
        flags.put(name, "");
      } else {
        flags.put(name, args[++i]);
      }
    }
    return flags;
  }
}
