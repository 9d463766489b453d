package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.jobbroker.v1.EnqueueRequest;
import dev.jobbroker.v1.EnqueueResponse;
import io.grpc.Deadline;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The coalescer's rules (contract §10) against a stubbed transport that the test answers by
 * hand, so every batch boundary is deterministic: callers join one at a time, in a known order.
 */
class EnqueueCoalescerTest {
  private static final EnqueueCoalescer.Key KEY = EnqueueCoalescer.Key.ofQueue("q", false);
  private static final EnqueueCoalescer.Key KEYED = EnqueueCoalescer.Key.ofQueue("q", true);

  private final ExecutorService callers = Executors.newCachedThreadPool();

  @AfterEach
  void stopCallers() {
    callers.shutdownNow();
  }

  /** One call the coalescer started; the test ends it with {@link #ok} or {@link #fail}. */
  record Call(List<EnqueueRequest> jobs, Deadline deadline, EnqueueCoalescer.Done done) {
    List<String> payloads() {
      return jobs.stream().map(j -> j.getPayload().toStringUtf8()).toList();
    }
  }

  /** Records calls; counts those not ended yet, and the most ever outstanding at once. */
  static final class StubTransport implements EnqueueCoalescer.Transport {
    final BlockingQueue<Call> calls = new LinkedBlockingQueue<>();
    final AtomicInteger outstanding = new AtomicInteger();
    final AtomicInteger maxOutstanding = new AtomicInteger();

    @Override
    public void send(List<EnqueueRequest> jobs, Deadline deadline, EnqueueCoalescer.Done done) {
      maxOutstanding.accumulateAndGet(outstanding.incrementAndGet(), Math::max);
      calls.add(new Call(List.copyOf(jobs), deadline, done));
    }

    Call next() throws InterruptedException {
      Call c = calls.poll(10, TimeUnit.SECONDS);
      if (c == null) {
        throw new AssertionError("no call was sent");
      }
      return c;
    }

    /** Answers every job with the id "id-PAYLOAD". */
    void ok(Call c) {
      outstanding.decrementAndGet();
      c.done()
          .done(
              c.payloads().stream()
                  .map(p -> EnqueueResponse.newBuilder().setJobId("id-" + p).build())
                  .toList(),
              null);
    }

    void fail(Call c, Status status) {
      outstanding.decrementAndGet();
      c.done().done(null, status.asRuntimeException());
    }
  }

  private static EnqueueRequest job(String payload) {
    return EnqueueRequest.newBuilder()
        .setQueue("q")
        .setPayload(ByteString.copyFromUtf8(payload))
        .build();
  }

  private static ClientOptions.Builder options() {
    return ClientOptions.builder().address("unused:1").retries(3, Duration.ofMillis(1));
  }

  /** Starts a caller of {@code request} and waits until its job has joined a batch. */
  private Future<EnqueueResponse> join(
      EnqueueCoalescer c, EnqueueRequest request, EnqueueCoalescer.Key key)
      throws InterruptedException {
    long before = c.joinedJobs();
    Future<EnqueueResponse> f = callers.submit(() -> c.enqueue(request, key, null));
    long giveUp = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (c.joinedJobs() == before) {
      if (System.nanoTime() > giveUp) {
        throw new AssertionError("the caller never joined a batch");
      }
      Thread.sleep(1);
    }
    return f;
  }

  @Test
  void batchesHoldAtMostMaxJobsInCallOrderAndOnlyMaxInFlightAreOutstanding() throws Exception {
    StubTransport t = new StubTransport();
    EnqueueCoalescer c =
        new EnqueueCoalescer(options().batchMaxJobs(10).batchMaxInFlight(1).build(), t);
    List<Future<EnqueueResponse>> answers = new ArrayList<>();
    for (int i = 0; i < 35; i++) {
      answers.add(join(c, job(Integer.toString(i)), KEY));
    }
    // Job 0 went alone, at once (nothing was in flight); the other 34 waited behind it.
    List<List<String>> batches = new ArrayList<>();
    for (int n = 0; n < 5; n++) {
      Call call = t.next();
      assertNull(t.calls.peek(), "a second batch was sent while one was in flight");
      batches.add(call.payloads());
      t.ok(call);
    }
    List<String> sent = new ArrayList<>();
    batches.forEach(sent::addAll);
    List<Integer> sizes = batches.stream().map(List::size).toList();
    assertEquals(List.of(1, 10, 10, 10, 4), sizes);
    for (int i = 0; i < 35; i++) {
      assertEquals(Integer.toString(i), sent.get(i), "jobs in the order of their calls");
      assertEquals("id-" + i, answers.get(i).get(10, TimeUnit.SECONDS).getJobId());
    }
    assertEquals(1, t.maxOutstanding.get());
    assertEquals(0, c.unfinishedBatches());
  }

  @Test
  void noMoreThanMaxInFlightBatchesOfAKeyAreOutstanding() throws Exception {
    StubTransport t = new StubTransport();
    EnqueueCoalescer c = new EnqueueCoalescer(options().batchMaxInFlight(2).build(), t);
    List<Future<EnqueueResponse>> answers = new ArrayList<>();
    for (int i = 0; i < 6; i++) {
      answers.add(join(c, job(Integer.toString(i)), KEY));
    }
    Call first = t.next();
    Call second = t.next();
    assertEquals(List.of("0"), first.payloads());
    assertEquals(List.of("1"), second.payloads());
    assertNull(t.calls.peek(), "2 in flight: the other jobs wait");
    // Another key is not held back by this one's limit.
    Future<EnqueueResponse> other = join(c, job("keyed"), KEYED);
    Call keyed = t.next();
    assertEquals(List.of("keyed"), keyed.payloads());
    t.ok(keyed);
    assertEquals("id-keyed", other.get(10, TimeUnit.SECONDS).getJobId());

    t.ok(second); // a batch ends: the waiting jobs go at once, together
    Call rest = t.next();
    assertEquals(List.of("2", "3", "4", "5"), rest.payloads());
    t.ok(first);
    t.ok(rest);
    for (int i = 0; i < 6; i++) {
      assertEquals("id-" + i, answers.get(i).get(10, TimeUnit.SECONDS).getJobId());
    }
    assertEquals(3, t.maxOutstanding.get(), "2 of the key, 1 of the other key");
  }

  @Test
  void aBatchGoesOnceItsPayloadAndHeaderBytesReachMaxBytes() throws Exception {
    EnqueueRequest withHeader =
        job("x".repeat(30)).toBuilder().putHeaders("ab", "cdé").build(); // 30 + 2 + 4 bytes
    assertEquals(36, EnqueueCoalescer.bytesOf(withHeader));

    StubTransport t = new StubTransport();
    EnqueueCoalescer c =
        new EnqueueCoalescer(options().batchMaxBytes(100).batchMaxInFlight(1).build(), t);
    List<Future<EnqueueResponse>> answers = new ArrayList<>();
    answers.add(join(c, job("first"), KEY)); // sent alone: nothing in flight
    for (int i = 0; i < 5; i++) {
      answers.add(join(c, withHeader.toBuilder().setPayload(payload(i, 30)).build(), KEY));
    }
    // 36 bytes each: two fill 72, a third would pass 100, so it opens the next batch.
    List<Integer> sizes = new ArrayList<>();
    for (int n = 0; n < 4; n++) {
      Call call = t.next();
      sizes.add(call.jobs().size());
      long bytes = call.jobs().stream().mapToLong(EnqueueCoalescer::bytesOf).sum();
      assertTrue(bytes <= 100, "a batch of " + bytes + " bytes");
      t.ok(call);
    }
    assertEquals(List.of(1, 2, 2, 1), sizes);
    for (Future<EnqueueResponse> a : answers) {
      assertFalse(a.get(10, TimeUnit.SECONDS).getJobId().isEmpty());
    }

    // A job that alone reaches the limit goes at once, by itself.
    EnqueueCoalescer single = new EnqueueCoalescer(options().batchMaxBytes(10).build(), t);
    Future<EnqueueResponse> big = join(single, job("x".repeat(50)), KEY);
    t.ok(t.next());
    assertEquals("id-" + "x".repeat(50), big.get(10, TimeUnit.SECONDS).getJobId());
  }

  private static ByteString payload(int i, int size) {
    String s = i + "-";
    return ByteString.copyFromUtf8(s + "y".repeat(size - s.length()));
  }

  @Test
  void closeSendsTheGatheringBatchAndWaitsForItsAnswer() throws Exception {
    StubTransport t = new StubTransport();
    // A linger of an hour: only close() sends the batch.
    EnqueueCoalescer c =
        new EnqueueCoalescer(options().batchLinger(Duration.ofHours(1)).build(), t);
    List<Future<EnqueueResponse>> answers = new ArrayList<>();
    for (int i = 0; i < 3; i++) {
      answers.add(join(c, job(Integer.toString(i)), KEY));
    }
    assertNull(t.calls.poll(200, TimeUnit.MILLISECONDS), "nothing is sent before the linger");
    Future<?> closed = callers.submit(c::close);
    Call call = t.next();
    assertEquals(List.of("0", "1", "2"), call.payloads());
    assertFalse(closed.isDone(), "close() waits for the batch in flight");
    t.ok(call);
    closed.get(10, TimeUnit.SECONDS);
    for (int i = 0; i < 3; i++) {
      assertEquals("id-" + i, answers.get(i).get(10, TimeUnit.SECONDS).getJobId());
    }
  }

  @Test
  void aRefusedBatchIsSentAgainOneJobPerCallAndOnlyTheBadJobFails() throws Exception {
    StubTransport t = new StubTransport();
    EnqueueCoalescer c = new EnqueueCoalescer(options().batchMaxInFlight(1).build(), t);
    Future<EnqueueResponse> first = join(c, job("first"), KEY);
    List<Future<EnqueueResponse>> answers = new ArrayList<>();
    for (String p : List.of("a", "bad", "b")) {
      answers.add(join(c, job(p), KEY));
    }
    t.ok(t.next());
    first.get(10, TimeUnit.SECONDS);
    Call batch = t.next();
    assertEquals(List.of("a", "bad", "b"), batch.payloads());
    t.fail(batch, Status.INVALID_ARGUMENT.withDescription("jobs[1].headers: empty name"));
    for (int n = 0; n < 3; n++) {
      Call alone = t.next();
      assertEquals(1, alone.jobs().size());
      if (alone.payloads().get(0).equals("bad")) {
        t.fail(alone, Status.INVALID_ARGUMENT.withDescription("headers: empty name"));
      } else {
        t.ok(alone);
      }
    }
    assertEquals("id-a", answers.get(0).get(10, TimeUnit.SECONDS).getJobId());
    assertEquals("id-b", answers.get(2).get(10, TimeUnit.SECONDS).getJobId());
    ExecutionException e =
        assertThrows(ExecutionException.class, () -> answers.get(1).get(10, TimeUnit.SECONDS));
    StatusRuntimeException s = (StatusRuntimeException) e.getCause();
    assertEquals(Status.Code.INVALID_ARGUMENT, s.getStatus().getCode());
    assertEquals("headers: empty name", s.getStatus().getDescription());
    assertEquals(0, c.unfinishedBatches());
  }

  @Test
  void otherErrorsReachEveryCallerAndOnlyDedupKeyedBatchesAreRetried() throws Exception {
    StubTransport t = new StubTransport();
    EnqueueCoalescer c = new EnqueueCoalescer(options().batchMaxInFlight(1).build(), t);

    // Without dedup keys: UNAVAILABLE is every caller's answer, not retried.
    Future<EnqueueResponse> first = join(c, job("first"), KEY);
    Future<EnqueueResponse> a = join(c, job("a"), KEY);
    Future<EnqueueResponse> b = join(c, job("b"), KEY);
    t.ok(t.next());
    first.get(10, TimeUnit.SECONDS);
    t.fail(t.next(), Status.UNAVAILABLE);
    for (Future<EnqueueResponse> f : List.of(a, b)) {
      ExecutionException e =
          assertThrows(ExecutionException.class, () -> f.get(10, TimeUnit.SECONDS));
      assertEquals(
          Status.Code.UNAVAILABLE,
          ((StatusRuntimeException) e.getCause()).getStatus().getCode());
    }
    assertNull(t.calls.poll(100, TimeUnit.MILLISECONDS), "a keyless batch is sent once");

    // With dedup keys: the same batch again, up to the attempts.
    Future<EnqueueResponse> k0 = join(c, job("k0").toBuilder().setDedupKey("0").build(), KEYED);
    Future<EnqueueResponse> k1 = join(c, job("k1").toBuilder().setDedupKey("1").build(), KEYED);
    Future<EnqueueResponse> k2 = join(c, job("k2").toBuilder().setDedupKey("2").build(), KEYED);
    t.ok(t.next());
    k0.get(10, TimeUnit.SECONDS);
    Call keyed = t.next();
    t.fail(keyed, Status.UNAVAILABLE);
    Call again = t.next();
    assertEquals(keyed.payloads(), again.payloads());
    t.ok(again);
    assertEquals("id-k1", k1.get(10, TimeUnit.SECONDS).getJobId());
    assertEquals("id-k2", k2.get(10, TimeUnit.SECONDS).getJobId());
  }

  @Test
  void aBatchCarriesTheEarliestDeadlineOfItsCallers() throws Exception {
    StubTransport t = new StubTransport();
    EnqueueCoalescer c = new EnqueueCoalescer(options().batchMaxInFlight(1).build(), t);
    Future<EnqueueResponse> first = join(c, job("first"), KEY);
    Deadline late = Deadline.after(1, TimeUnit.HOURS);
    Deadline early = Deadline.after(30, TimeUnit.MINUTES);
    callers.submit(() -> c.enqueue(job("a"), KEY, late));
    callers.submit(() -> c.enqueue(job("b"), KEY, early));
    callers.submit(() -> c.enqueue(job("c"), KEY, null));
    while (c.joinedJobs() < 4) {
      Thread.sleep(1);
    }
    t.ok(t.next());
    first.get(10, TimeUnit.SECONDS);
    Call batch = t.next();
    assertEquals(3, batch.jobs().size());
    assertSame(early, batch.deadline());
    t.ok(batch);
  }

  @Test
  void badBatchOptionsAreRefusedNamingTheOption() {
    for (int bad : new int[] {0, 1001}) {
      IllegalArgumentException e =
          assertThrows(
              IllegalArgumentException.class, () -> ClientOptions.builder().batchMaxJobs(bad));
      assertTrue(e.getMessage().contains("batchMaxJobs"), e.getMessage());
    }
    IllegalArgumentException bytes =
        assertThrows(
            IllegalArgumentException.class, () -> ClientOptions.builder().batchMaxBytes(0));
    assertTrue(bytes.getMessage().contains("batchMaxBytes"), bytes.getMessage());
    IllegalArgumentException linger =
        assertThrows(
            IllegalArgumentException.class,
            () -> ClientOptions.builder().batchLinger(Duration.ofMillis(-1)));
    assertTrue(linger.getMessage().contains("batchLinger"), linger.getMessage());
    IllegalArgumentException inFlight =
        assertThrows(
            IllegalArgumentException.class, () -> ClientOptions.builder().batchMaxInFlight(0));
    assertTrue(inFlight.getMessage().contains("batchMaxInFlight"), inFlight.getMessage());

    ClientOptions defaults = ClientOptions.builder().address("x:1").build();
    assertTrue(defaults.batching());
    assertEquals(100, defaults.batchMaxJobs());
    assertEquals(1L << 20, defaults.batchMaxBytes());
    assertEquals(Duration.ZERO, defaults.batchLinger());
    assertEquals(4, defaults.batchMaxInFlight());
  }
}
