package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Timestamp;
import dev.jobbroker.v1.BrokerGrpc;
import dev.jobbroker.v1.LeasedJob;
import dev.jobbroker.v1.WorkRequest;
import dev.jobbroker.v1.WorkResponse;
import dev.jobbroker.v1.WorkResult;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Predicate;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Contract §4 and §5 rules that the real broker shows only in a cluster handing a partition over
 * (the cluster_leader_kill scenario): an answer UNAVAILABLE ("retry") to an ack, fail, release or
 * step save, and a subscription answered UNAVAILABLE while the stream stays open. A real broker
 * cannot be made to answer so on demand, so these tests run the Worker against a stand-in Broker
 * service ({@link StandIn}) in this JVM that answers exactly that.
 */
class AnswerRetryTest {
  private Server server;
  private JobBrokerClient client;
  private Worker worker;

  @AfterEach
  void tearDown() throws Exception {
    if (worker != null) {
      worker.stop(Duration.ofSeconds(2));
    }
    if (client != null) {
      client.close();
    }
    if (server != null) {
      server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  /** One request the stand-in received: its kind, its lease id, the stream it came on (1-based). */
  record Received(String kind, String leaseId, int stream) {}

  /**
   * A stand-in Broker service. Its first stream's subscription is answered {@code
   * firstSubscribe} (OK, or an error while the stream stays open); the first subscribed stream
   * gets {@code jobs} pushed. With {@code refuseFirstAnswers}, the first ack, fail, release and
   * checkpoint save of each lease are answered UNAVAILABLE ("retry"), later ones OK.
   */
  static final class StandIn extends BrokerGrpc.BrokerImplBase {
    final Status.Code firstSubscribe;
    final List<LeasedJob> jobs;
    final boolean refuseFirstAnswers;
    /** After refusing an answer UNAVAILABLE, end that stream UNAVAILABLE too (a leader died). */
    boolean endStreamAfterRefusal;
    final AtomicInteger streams = new AtomicInteger();
    final AtomicInteger streamsEndedByTheClient = new AtomicInteger();
    private final List<Received> received = new ArrayList<>(); // guarded by this
    private final Set<String> refused = new HashSet<>(); // kind/lease answered UNAVAILABLE
    private boolean pushed;

    StandIn(Status.Code firstSubscribe, List<LeasedJob> jobs, boolean refuseFirstAnswers) {
      this.firstSubscribe = firstSubscribe;
      this.jobs = jobs;
      this.refuseFirstAnswers = refuseFirstAnswers;
    }

    synchronized List<Received> received() {
      return List.copyOf(received);
    }

    synchronized long count(Predicate<Received> p) {
      return received.stream().filter(p).count();
    }

    @Override
    public StreamObserver<WorkRequest> work(StreamObserver<WorkResponse> out) {
      int stream = streams.incrementAndGet();
      return new StreamObserver<>() {
        @Override
        public void onNext(WorkRequest req) {
          WorkResult.Builder result = WorkResult.newBuilder().setRequestId(req.getRequestId());
          List<LeasedJob> push = List.of();
          boolean end;
          synchronized (StandIn.this) {
            int refusedBefore = refused.size();
            switch (req.getRequestCase()) {
              case SUBSCRIBE -> {
                if (stream == 1 && firstSubscribe != Status.Code.OK) {
                  // Answered with an error, and the stream stays open (never pushes).
                  result
                      .setCode(firstSubscribe.value())
                      .setMessage(
                          firstSubscribe == Status.Code.UNAVAILABLE
                              ? "partition 0 of queue q has no leader yet"
                              : "refused by the stand-in");
                } else if (!pushed) {
                  pushed = true;
                  push = jobs;
                }
                received.add(new Received("subscribe", "", stream));
              }
              case ACK -> answer("ack", req.getAck().getLeaseId(), stream, result);
              case ACK_BATCH -> {
                // Every item of a batch answered alike: UNAVAILABLE as the message's code.
                for (var a : req.getAckBatch().getAcksList()) {
                  answer("ack", a.getLeaseId(), stream, result);
                }
              }
              case FAIL -> answer("fail", req.getFail().getLeaseId(), stream, result);
              case RELEASE -> answer("release", req.getRelease().getLeaseId(), stream, result);
              case HEARTBEAT -> {
                if (!req.getHeartbeat().getCheckpoint().isEmpty()) {
                  answer("checkpoint", req.getHeartbeat().getLeaseId(), stream, result);
                }
              }
              default -> {}
            }
            end = endStreamAfterRefusal && refused.size() > refusedBefore;
          }
          out.onNext(WorkResponse.newBuilder().setResult(result).build());
          if (end) {
            out.onError(Status.UNAVAILABLE.withDescription("leader gone").asRuntimeException());
            return;
          }
          if (!push.isEmpty()) {
            out.onNext(
                WorkResponse.newBuilder()
                    .setJobBatch(dev.jobbroker.v1.JobBatch.newBuilder().addAllJobs(push))
                    .build());
          }
        }

        @Override
        public void onError(Throwable t) {
          streamsEndedByTheClient.incrementAndGet(); // the client cancelled the call
        }

        @Override
        public void onCompleted() {
          streamsEndedByTheClient.incrementAndGet(); // the client half-closed
          out.onCompleted();
        }
      };
    }

    private void answer(String kind, String leaseId, int stream, WorkResult.Builder result) {
      received.add(new Received(kind, leaseId, stream));
      if (refuseFirstAnswers && refused.add(kind + "/" + leaseId)) {
        result
            .setCode(Status.Code.UNAVAILABLE.value())
            .setMessage("partition 0: node-2 leads it but does not serve it at this moment; retry");
      }
    }
  }

  private static LeasedJob job(String queue, String n) {
    long later = System.currentTimeMillis() / 1000 + 60;
    return LeasedJob.newBuilder()
        .setJobId("job-" + n)
        .setLeaseId("lease-" + n)
        .setQueue(queue)
        .setAttempt(1)
        .setMaxAttempts(3)
        .setLeaseDeadline(Timestamp.newBuilder().setSeconds(later))
        .build();
  }

  private Worker.Builder serve(StandIn standIn) throws Exception {
    server =
        Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
            .addService(standIn)
            .build()
            .start();
    client =
        JobBrokerClient.connect(
            ClientOptions.builder().address("127.0.0.1:" + server.getPort()).build());
    return Worker.builder(client).reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(200));
  }

  private static void await(String what, java.util.function.BooleanSupplier done)
      throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("not within 10 s: " + what);
      }
      Thread.sleep(20);
    }
  }

  /**
   * Contract §4: an ack, fail, release or step save answered UNAVAILABLE is not final; it is sent
   * again with the same lease id (here on the same stream, which stays open). Without the rule the
   * helper counted each as refused and dropped it: the job would run again when its lease ran out.
   */
  @Test
  void answersRefusedWithUnavailableAreSentAgain() throws Exception {
    StandIn standIn =
        new StandIn(
            Status.Code.OK,
            List.of(job("acks", "a"), job("fails", "f"), job("snoozes", "s")),
            true);
    AtomicInteger stepRuns = new AtomicInteger();
    worker =
        serve(standIn)
            .concurrency(3)
            .handle(
                "acks",
                job -> {
                  // The step's save is refused once, then taken: step() returns normally.
                  job.step("render", () -> stepRuns.incrementAndGet());
                  return "done";
                })
            .handle(
                "fails",
                job -> {
                  throw new IllegalStateException("boom");
                })
            .handle(
                "snoozes",
                job -> {
                  throw new Snooze(Duration.ofSeconds(5));
                })
            .build();
    assertTimeoutPreemptively(
        Duration.ofSeconds(20),
        () -> {
          worker.start();
          await(
              "every answer taken",
              () -> {
                Worker.Stats st = worker.stats();
                return st.acked() == 1 && st.failed() == 1 && st.released() == 1;
              });
        });
    for (String[] kindLease :
        new String[][] {
          {"checkpoint", "lease-a"}, {"ack", "lease-a"}, {"fail", "lease-f"}, {"release", "lease-s"}
        }) {
      long n =
          standIn.count(r -> r.kind().equals(kindLease[0]) && r.leaseId().equals(kindLease[1]));
      assertEquals(2, n, kindLease[0] + " of " + kindLease[1] + ": " + standIn.received());
    }
    assertEquals(1, stepRuns.get(), "the step's body ran once");
    assertEquals(1, standIn.streams.get(), "retried on the same stream: " + standIn.received());
    assertEquals(0, worker.stats().reconnects());
  }

  /**
   * Contract §4: an ack answered UNAVAILABLE whose stream then ends (before the 250 ms) goes out,
   * with the same lease id, on the next stream.
   */
  @Test
  void anAckRefusedWithUnavailableGoesOutOnTheNextStreamIfItsStreamEnds() throws Exception {
    StandIn standIn = new StandIn(Status.Code.OK, List.of(job("q", "1")), true);
    standIn.endStreamAfterRefusal = true;
    worker = serve(standIn).handle("q", job -> "ok").build();
    assertTimeoutPreemptively(
        Duration.ofSeconds(20),
        () -> {
          worker.start();
          await("the ack taken", () -> worker.stats().acked() == 1);
        });
    assertEquals(
        List.of(
            new Received("subscribe", "", 1),
            new Received("ack", "lease-1", 1),
            new Received("subscribe", "", 2),
            new Received("ack", "lease-1", 2)),
        standIn.received());
  }

  /**
   * Contract §5: a subscription answered UNAVAILABLE while the stream stays open (a queue's
   * partition has no leader yet) is a stream that ended UNAVAILABLE: the helper ends it and
   * reconnects after its backoff. Without the rule it waited on a stream that never pushes.
   */
  @Test
  void aSubscriptionRefusedUnavailableOnAnOpenStreamReconnects() throws Exception {
    StandIn standIn = new StandIn(Status.Code.UNAVAILABLE, List.of(job("q", "1")), false);
    worker = serve(standIn).handle("q", job -> "ok").build();
    assertTimeoutPreemptively(
        Duration.ofSeconds(20),
        () -> {
          worker.start();
          await("the job pushed on the second stream acked", () -> worker.stats().acked() == 1);
        });
    assertEquals(2, standIn.streams.get(), standIn.received().toString());
    await(
        "the refused stream ended by the helper",
        () -> standIn.streamsEndedByTheClient.get() >= 1);
    assertEquals(new Received("ack", "lease-1", 2), standIn.received().get(2));
    assertTrue(worker.stats().reconnects() >= 1);
    assertEquals(null, worker.refusal());
  }

  /** Contract §5: a non-retryable code there still ends the run call, with that code. */
  @Test
  void aSubscriptionRefusedInvalidArgumentOnAnOpenStreamEndsTheRun() throws Exception {
    StandIn standIn = new StandIn(Status.Code.INVALID_ARGUMENT, List.of(), false);
    worker = serve(standIn).handle("q", job -> "ok").build();
    StatusRuntimeException e =
        assertTimeoutPreemptively(
            Duration.ofSeconds(20), () -> assertThrows(StatusRuntimeException.class, worker::run));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
    assertEquals(1, standIn.streams.get());
  }
}
