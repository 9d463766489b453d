// Middleware on both sides (docs/worker-contract.md §9) and the OpenTelemetry tracing built on
// it, against the real broker; spans go to the SDK's in-memory exporter.
import assert from "node:assert/strict";
import { after, afterEach, before, describe, test } from "node:test";
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { Client, FailReason, JobEndedError, JobState, PermanentError, Worker, type Job, type JobContext } from "../src";
import { tracingProducer, tracingWorker } from "../src/tracing";
import { Broker } from "./broker";

const quiet = () => {};

describe("middleware", () => {
  let broker: Broker;

  before(async () => {
    broker = await Broker.start({ config: { queues: { "mw-fail": { retry: { maxAttempts: 1 } } } } });
  });
  after(async () => {
    await broker?.dispose();
  });

  test("worker middleware wraps the handler, the first added outermost, and its result is the job's", async () => {
    const order: string[] = [];
    const worker = new Worker({ address: broker.address, log: quiet })
      .use(async (job, next) => {
        order.push(`outer> ${job.queue}`);
        const result = await next();
        order.push("<outer");
        return { wrapped: result };
      })
      .use(async (_job, next) => {
        order.push("inner>");
        try {
          return await next();
        } finally {
          order.push("<inner");
        }
      })
      .handle("mw", (job) => {
        order.push("handler");
        return job.text();
      });
    const client = new Client(broker.address);
    await worker.start();
    try {
      const job = await client.enqueueAndWait("mw", "payload", { waitTimeoutMs: 30_000 });
      assert.deepEqual(order, ["outer> mw", "inner>", "handler", "<inner", "<outer"]);
      assert.deepEqual(JSON.parse(job.result.toString()), { wrapped: "payload" });
    } finally {
      await worker.stop();
      client.close();
    }
  });

  test("what worker middleware throws is the attempt's end, as if the handler had thrown it", async () => {
    let handlerRan = false;
    const worker = new Worker({ address: broker.address, log: quiet })
      .use(async (job) => {
        throw new PermanentError(`refused ${job.jobId}`);
      })
      .handle("mw-fail", () => {
        handlerRan = true;
      });
    const client = new Client(broker.address);
    await worker.start();
    try {
      const err = await client.enqueueAndWait("mw-fail", "x", { waitTimeoutMs: 30_000 }).then(
        () => assert.fail("the job should have failed"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof JobEndedError);
      assert.equal(err.job.failReason, FailReason.FAIL_REASON_PERMANENT);
      assert.equal(handlerRan, false);
    } finally {
      await worker.stop();
      client.close();
    }
  });

  test("producer middleware wraps every enqueue and may add headers, in a batch too", async () => {
    const order: string[] = [];
    const client = new Client(broker.address)
      .use(async (request, next) => {
        order.push(`outer ${request.queue}`);
        request.headers["tenant"] = "acme";
        return next(request);
      })
      .use(async (request, next) => {
        order.push("inner");
        const result = await next({ ...request, priority: 9 });
        order.push(`sent ${result.jobId === "" ? "?" : "id"}`);
        return result;
      });
    try {
      const { jobId } = await client.enqueue("mw-produce", "x", { headers: { own: "1" } });
      assert.deepEqual(order, ["outer mw-produce", "inner", "sent id"]);
      const job = await client.getJob(jobId);
      assert.deepEqual(job.headers, { own: "1", tenant: "acme" });
      assert.equal(job.priority, 9);

      const results = await client.enqueueBatch([
        { queue: "mw-produce", payload: "a" },
        { queue: "mw-produce", payload: "b", dependsOnIndex: [0] },
      ]);
      for (const r of results) assert.equal((await client.getJob(r.jobId)).headers["tenant"], "acme");
      assert.deepEqual((await client.getJob(results[1].jobId)).dependsOn, [results[0].jobId]);
    } finally {
      client.close();
    }
  });

  test("a producer middleware that answers without next sends nothing; in a batch it refuses the batch", async () => {
    const client = new Client(broker.address).use(async (request, next) =>
      request.payload.toString() === "skip" ? { jobId: "skipped", deduplicated: true } : next(request),
    );
    try {
      assert.deepEqual(await client.enqueue("mw-skip", "skip"), { jobId: "skipped", deduplicated: true });
      await assert.rejects(
        client.enqueueBatch([{ queue: "mw-skip", payload: "keep" }, { queue: "mw-skip", payload: "skip" }]),
        /without calling next/,
      );
      await assert.rejects(client.getQueue("mw-skip")); // nothing ever reached the queue
    } finally {
      client.close();
    }
  });
});

describe("OpenTelemetry tracing", () => {
  let broker: Broker;
  const exporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const propagator = new W3CTraceContextPropagator();

  before(async () => {
    broker = await Broker.start({ config: { queues: { "traced-fail": { retry: { maxAttempts: 1 } } } } });
  });
  afterEach(() => exporter.reset());
  after(async () => {
    await tracerProvider.shutdown();
    await broker?.dispose();
  });

  async function traced(queue: string, handler: (job: JobContext) => unknown, payload: string): Promise<{ job?: Job; error?: unknown }> {
    const client = new Client(broker.address).use(tracingProducer({ tracerProvider, propagator }));
    const worker = new Worker({ address: broker.address, log: quiet }).use(tracingWorker({ tracerProvider, propagator })).handle(queue, handler);
    await worker.start();
    try {
      return await client.enqueueAndWait(queue, payload, { waitTimeoutMs: 30_000 }).then(
        (job) => ({ job }),
        (error: unknown) => ({ error }),
      );
    } finally {
      await worker.stop();
      client.close();
    }
  }

  function spanNamed(name: string) {
    const spans = exporter.getFinishedSpans().filter((s) => s.name === name);
    assert.equal(spans.length, 1, `one span "${name}" in ${exporter.getFinishedSpans().map((s) => s.name).join(", ")}`);
    return spans[0];
  }

  test("the consumer span is the producer span's child, through the job's traceparent header", async () => {
    let seenHeaders: Readonly<Record<string, string>> = {};
    const { job } = await traced("traced", (j) => {
      seenHeaders = j.headers;
      return "ok";
    }, "x");
    assert.equal(job?.state, JobState.JOB_STATE_COMPLETED);

    const producer = spanNamed("traced publish");
    const consumer = spanNamed("traced process");
    assert.equal(producer.kind, SpanKind.PRODUCER);
    assert.equal(consumer.kind, SpanKind.CONSUMER);
    assert.equal(consumer.spanContext().traceId, producer.spanContext().traceId);
    assert.equal(consumer.parentSpanContext?.spanId, producer.spanContext().spanId);
    assert.equal(producer.attributes["messaging.message.id"], job?.id);
    assert.equal(consumer.attributes["messaging.message.id"], job?.id);
    assert.equal(consumer.status.code, SpanStatusCode.UNSET);
    const { traceId, spanId } = producer.spanContext();
    assert.equal(seenHeaders["traceparent"], `00-${traceId}-${spanId}-01`);
  });

  test("a failing handler ends its consumer span with an error status", async () => {
    const { error } = await traced("traced-fail", () => {
      throw new Error("provider down");
    }, "y");
    assert.ok(error instanceof JobEndedError);
    const consumer = spanNamed("traced-fail process");
    assert.equal(consumer.status.code, SpanStatusCode.ERROR);
    assert.equal(consumer.status.message, "provider down");
    assert.equal(consumer.parentSpanContext?.spanId, spanNamed("traced-fail publish").spanContext().spanId);
  });
});
