// End-to-end bench of the Java worker helper: the workload of
// `jobbroker-bench stream --workers 1 --in-flight K --concurrency C --producer-batch B --jobs N`.
//
// Producers (C threads) enqueue N jobs of --payload-bytes bytes in EnqueueBatch calls of B, C
// calls in flight, while one dev.jobbroker.client.Worker handles them with a no-op handler at
// concurrency K. The run is timed from the first enqueue to the answer to the last ack (the
// worker's graceful stop waits for it), as jobbroker-bench's stream mode is. Prints one text line
// on stderr and one JSON line on stdout, with the fields of bench/workers/python_e2e.py (mode
// "stream-java").
//
// bench/workers/run.sh compiles it against client/java/target/classes and the client's runtime
// dependencies (into bench/workers/java/.build/) and runs it:
//   java -cp .build/classes:<client classes>:<deps> JavaE2e --address 127.0.0.1:7070 --jobs 20000
//
// --warmup-jobs W (default 0, which run.sh uses) first puts W jobs through the same worker and
// queue, untimed, so that the JVM has compiled the hot paths before the clock starts: the figure
// it gives is the warm worker's, not comparable with run.sh's table (the other languages' programs
// have no warm-up, and need none). "done" and the rate count the timed jobs only.

import dev.jobbroker.client.ClientOptions;
import dev.jobbroker.client.JobBrokerClient;
import dev.jobbroker.client.Worker;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.EnqueueBatchRequest;
import dev.jobbroker.v1.EnqueueRequest;
import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

public final class JavaE2e {
  /** Stop producing after this many failed calls, not spin on errors (as jobbroker-bench). */
  private static final long MAX_ERRORS = 100;

  private JavaE2e() {}

  /** jobbroker-bench's percentile: the sample at index min(n-1, p/100*n), in ms. */
  static double percentileMs(long[] sortedMicros, double p) {
    if (sortedMicros.length == 0) {
      return 0;
    }
    int i = Math.min(sortedMicros.length - 1, (int) (p / 100.0 * sortedMicros.length));
    return sortedMicros[i] / 1000.0;
  }

  static String jsonString(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }

  /** The process's CPU time so far in ns (HotSpot's bean), or 0 where it is not available. */
  static long processCpuNanos(java.lang.management.OperatingSystemMXBean os) {
    if (os instanceof com.sun.management.OperatingSystemMXBean hotspot) {
      return Math.max(0, hotspot.getProcessCpuTime());
    }
    return 0;
  }

  static double round(double x, int decimals) {
    double scale = Math.pow(10, decimals);
    return Math.round(x * scale) / scale;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>();
    args.put("address", "127.0.0.1:7070");
    args.put("jobs", "20000");
    args.put("in-flight", "64");
    args.put("concurrency", "4");
    args.put("producer-batch", "100");
    args.put("payload-bytes", "100");
    args.put("queue", "");
    args.put("timeout", "300");
    args.put("warmup-jobs", "0");
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (!a.startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + a);
      }
      String name = a.substring(2);
      String value;
      int eq = name.indexOf('=');
      if (eq >= 0) {
        value = name.substring(eq + 1);
        name = name.substring(0, eq);
      } else if (i + 1 < argv.length) {
        value = argv[++i];
      } else {
        throw new IllegalArgumentException(a + " needs a value");
      }
      if (!args.containsKey(name)) {
        throw new IllegalArgumentException("unknown option " + a);
      }
      args.put(name, value);
    }
    String address = args.get("address");
    long jobs = Long.parseLong(args.get("jobs"));
    int inFlight = Integer.parseInt(args.get("in-flight"));
    int concurrency = Integer.parseInt(args.get("concurrency"));
    int producerBatch = Integer.parseInt(args.get("producer-batch"));
    int payloadBytes = Integer.parseInt(args.get("payload-bytes"));
    long timeoutNanos = (long) (Double.parseDouble(args.get("timeout")) * 1e9);
    String queue = args.get("queue");
    long warmupJobs = Long.parseLong(args.get("warmup-jobs"));
    long pid = ProcessHandle.current().pid();
    if (queue.isEmpty()) {
      queue = "bench-stream-java-" + pid + "-" + System.currentTimeMillis();
    }
    final String q = queue;

    ClientOptions options = ClientOptions.builder().address(address).build();
    // The worker and the producers each get their own client, so their own connection, as in
    // the other languages' benches and jobbroker-bench (a Worker has its own channel there).
    JobBrokerClient workerClient = JobBrokerClient.connect(options);
    JobBrokerClient client = JobBrokerClient.connect(options);

    AtomicLong handled = new AtomicLong();
    CountDownLatch allHandled = new CountDownLatch(1);
    CountDownLatch warmedUp = new CountDownLatch(1);
    Worker worker =
        Worker.builder(workerClient)
            .concurrency(inFlight)
            .workerId("bench-stream-java-" + pid)
            .handle(
                q,
                job -> {
                  long n = handled.incrementAndGet();
                  if (n == warmupJobs) {
                    warmedUp.countDown();
                  }
                  if (n == warmupJobs + jobs) {
                    allHandled.countDown();
                  }
                  return null;
                })
            .build();
    // start() returns once the broker accepted the subscription, like jobbroker-bench's
    // Worker::Start: the clock starts after it.
    worker.start();

    // The same request every call (the jobs are identical): the producers' own cost stays out of
    // the measurement as far as it can, as jobbroker-bench's C++ producers do.
    byte[] bytes = new byte[payloadBytes];
    Arrays.fill(bytes, (byte) 'p');
    ByteString payload = ByteString.copyFrom(bytes);
    EnqueueRequest one = EnqueueRequest.newBuilder().setQueue(q).setPayload(payload).build();
    EnqueueBatchRequest full =
        EnqueueBatchRequest.newBuilder()
            .addAllJobs(Collections.nCopies(producerBatch, one))
            .build();
    if (warmupJobs > 0) {
      // Untimed: the same enqueue path and worker, until the worker has handled them all and
      // their acks are answered (acked counts only what the broker confirmed).
      BrokerGrpc.BrokerBlockingStub broker = client.broker();
      for (long sent = 0; sent < warmupJobs; sent += producerBatch) {
        int n = (int) Math.min(producerBatch, warmupJobs - sent);
        broker
            .withDeadlineAfter(30, TimeUnit.SECONDS)
            .enqueueBatch(
                EnqueueBatchRequest.newBuilder().addAllJobs(Collections.nCopies(n, one)).build());
      }
      if (!warmedUp.await(timeoutNanos, TimeUnit.NANOSECONDS)) {
        throw new IllegalStateException("the warm-up jobs were not handled in time");
      }
      long waitUntil = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      while (worker.stats().acked() < warmupJobs && System.nanoTime() - waitUntil < 0) {
        Thread.sleep(1);
      }
    }
    long deadline = System.nanoTime() + timeoutNanos;
    AtomicLong next = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicBoolean aborted = new AtomicBoolean();
    List<String> firstError = Collections.synchronizedList(new ArrayList<>());
    List<long[]> perProducer = Collections.synchronizedList(new ArrayList<>());

    Runnable producer =
        () -> {
          BrokerGrpc.BrokerBlockingStub broker = client.broker();
          long[] mine = new long[16];
          int count = 0;
          while (!aborted.get() && System.nanoTime() - deadline < 0) {
            long first = next.getAndAdd(producerBatch);
            if (first >= jobs) {
              break;
            }
            int n = (int) Math.min(producerBatch, jobs - first);
            EnqueueBatchRequest req =
                n == producerBatch
                    ? full
                    : EnqueueBatchRequest.newBuilder()
                        .addAllJobs(Collections.nCopies(n, one))
                        .build();
            long start = System.nanoTime();
            try {
              broker.withDeadlineAfter(30, TimeUnit.SECONDS).enqueueBatch(req);
            } catch (StatusRuntimeException e) {
              if (errors.incrementAndGet() >= MAX_ERRORS) {
                aborted.set(true);
              }
              synchronized (firstError) {
                if (firstError.isEmpty()) {
                  String details = e.getStatus().getDescription();
                  firstError.add(
                      "EnqueueBatch: "
                          + e.getStatus().getCode()
                          + ": "
                          + (details == null ? "" : details));
                }
              }
              continue;
            }
            if (count == mine.length) {
              mine = Arrays.copyOf(mine, count * 2);
            }
            mine[count++] = (System.nanoTime() - start) / 1000;
          }
          perProducer.add(Arrays.copyOf(mine, count));
        };

    java.lang.management.OperatingSystemMXBean os =
        java.lang.management.ManagementFactory.getOperatingSystemMXBean();
    long cpuStart = processCpuNanos(os);
    long start = System.nanoTime();
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < concurrency; i++) {
      Thread t = new Thread(producer, "producer-" + i);
      t.start();
      threads.add(t);
    }
    for (Thread t : threads) {
      t.join();
    }
    boolean timedOut = false;
    if (!aborted.get()) {
      long left = Math.max(deadline - System.nanoTime(), 1_000_000);
      timedOut = !allHandled.await(left, TimeUnit.NANOSECONDS);
    }
    // The graceful stop returns once the broker has answered the last ack.
    worker.stop(Duration.ofSeconds(30));
    double seconds = (System.nanoTime() - start) / 1e9;
    // This process's CPU (all its threads: producers, worker, gRPC, JIT and GC) over the timed
    // run; on the text line only, so that the JSON line keeps python_e2e.py's fields.
    double cpuSeconds = (processCpuNanos(os) - cpuStart) / 1e9;
    client.close();
    workerClient.close();

    long acked = worker.stats().acked() - warmupJobs;
    long[] latencies = perProducer.stream().flatMapToLong(Arrays::stream).sorted().toArray();
    String grpcVersion = ManagedChannel.class.getPackage().getImplementationVersion();
    String runtime =
        "java "
            + System.getProperty("java.version")
            + ", grpc-java "
            + (grpcVersion == null ? "?" : grpcVersion);
    double jobsPerSec = seconds > 0 ? round(acked / seconds, 1) : 0;
    boolean late = timedOut && acked < jobs;
    String first = firstError.isEmpty() ? "" : firstError.get(0);
    // python_e2e.py's fields, in its order. Worker.Stats has no count of ack messages or of
    // refused acks: both are 0, as python_e2e.py reports a count its Worker lacks.
    String json =
        "{\"mode\":\"stream-java\""
            + ",\"address\":" + jsonString(address)
            + ",\"concurrency\":" + concurrency
            + ",\"workers\":1"
            + ",\"jobs\":" + jobs
            + ",\"done\":" + acked
            + ",\"payload_bytes\":" + payloadBytes
            + ",\"seconds\":" + round(seconds, 4)
            + ",\"jobs_per_sec\":" + jobsPerSec
            + ",\"in_flight\":" + inFlight
            + ",\"producer_batch\":" + producerBatch
            + ",\"latency_of\":\"enqueue\""
            + ",\"p50_ms\":" + percentileMs(latencies, 50)
            + ",\"p90_ms\":" + percentileMs(latencies, 90)
            + ",\"p99_ms\":" + percentileMs(latencies, 99)
            + ",\"max_ms\":" + percentileMs(latencies, 100)
            + ",\"errors\":" + errors.get()
            + ",\"timed_out\":" + late
            + ",\"first_error\":" + jsonString(first)
            + ",\"ack_messages\":0"
            + ",\"acks_refused\":0"
            + ",\"runtime\":" + jsonString(runtime)
            + "}";
    System.err.println(
        String.format(
            Locale.ROOT,
            "stream-java in_flight=%d jobs=%d done=%d seconds=%.3f jobs_per_sec=%.1f"
                + " ack_messages=0 errors=%d process_cpu_seconds=%.2f%s",
            inFlight,
            jobs,
            acked,
            seconds,
            jobsPerSec,
            errors.get(),
            cpuSeconds,
            late ? " TIMED_OUT" : ""));
    System.out.println(json);
    System.out.flush();
    System.exit(acked >= jobs && errors.get() == 0 ? 0 : 1);
  }
}
