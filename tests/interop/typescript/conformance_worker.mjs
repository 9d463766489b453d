// The TypeScript conformance worker (tests/interop/CONFORMANCE.md): the shortest program on the
// library's Worker that reaches every behaviour of docs/worker-contract.md. One handler per
// --queues entry; the job's payload says what the handler does; events go to --events, one JSON
// line per write so the harness can read them while the worker runs and after a SIGKILL.
import { closeSync, existsSync, openSync, readFileSync, writeSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";

// The package's ESM build (what `import "@jobbroker/client"` loads: the "import" condition of
// client/typescript/package.json's exports), built by client/typescript/test.sh.
import { PermanentError, Worker, retryAfter, snooze } from "../../../client/typescript/dist/esm/index.js";

const { values: args } = parseArgs({
  options: {
    address: { type: "string" },
    queues: { type: "string" },
    events: { type: "string" },
    concurrency: { type: "string", default: "1" },
    prefetch: { type: "string", default: "0" },
    "lease-ms": { type: "string", default: "0" },
    "grace-ms": { type: "string", default: "10000" },
    "die-at-step": { type: "string" },
    "die-after-user": { type: "string" },
    outbox: { type: "string" },
    idempotent: { type: "boolean", default: false },
    "lang-name": { type: "string", default: "typescript" },
    ca: { type: "string" },
    cert: { type: "string" },
    key: { type: "string" },
    token: { type: "string" },
  },
});
for (const required of ["address", "queues", "events"]) {
  if (!args[required]) {
    console.error(`conformance_worker.mjs: --${required} is required (see tests/interop/CONFORMANCE.md)`);
    process.exit(2);
  }
}

// Opened for appending once; each event is one write(2), so lines never interleave and a
// SIGKILL loses none that were written.
const eventsFd = openSync(args.events, "a");
function event(fields) {
  writeSync(eventsFd, JSON.stringify(fields) + "\n");
}
function jobEvent(name, job, extra = {}) {
  event({ event: name, job: job.jobId, attempt: job.attempt, ...extra });
}

function die() {
  process.kill(process.pid, "SIGKILL");
}

/** Ends the handler as cancelled, the library's idiom: re-throw the signal's reason. */
function endCancelled(job) {
  jobEvent("cancelled", job);
  throw job.signal.reason;
}

/** Resolves when the job's signal aborts. */
function aborted(signal) {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
}

// The fake email provider of the sign-up example: one JSON line per email sent. With a key it
// already holds, it sends nothing (the idempotency key at work).
function sendEmail(user, key, dedupe) {
  if (dedupe && existsSync(args.outbox)) {
    const sent = readFileSync(args.outbox, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
    if (sent.some((line) => line.key === key)) return;
  }
  const fd = openSync(args.outbox, "a");
  try {
    writeSync(fd, JSON.stringify({ user, key }) + "\n");
  } finally {
    closeSync(fd);
  }
}

const snoozedJobs = new Set(); // job ids this process has snoozed once

function handlerFor(queue) {
  return async (job) => {
    jobEvent("start", job, { queue: job.queue, handler: queue });
    const p = job.json();
    const ok = () => {
      jobEvent("done", job);
      return { queue, echo: p.echo ?? null };
    };
    const beforeOkAttempt = p.ok_from_attempt === undefined || job.attempt < p.ok_from_attempt;
    switch (p.action) {
      case "ok":
        return ok();
      case "sleep":
        try {
          await sleep(p.ms, undefined, { signal: job.signal });
        } catch (e) {
          if (job.signal.aborted) endCancelled(job);
          throw e;
        }
        return ok();
      case "wait_cancel":
        if (!beforeOkAttempt) return ok();
        await aborted(job.signal);
        if (p.after_cancel === "return") {
          // The work was done after all: a normal return, which the library acks.
          jobEvent("cancelled", job);
          return ok();
        }
        return endCancelled(job);
      case "ignore_cancel":
        // A handler stuck in a blocking call: a timer that does not look at the signal.
        if (beforeOkAttempt) await sleep(p.ms);
        return ok();
      case "fail":
        if (beforeOkAttempt) throw new Error(p.message);
        return ok();
      case "permanent":
        throw new PermanentError(p.message);
      case "retry_after":
        if (job.attempt === 1) throw retryAfter(p.ms, p.message);
        return ok();
      case "snooze":
        if (!snoozedJobs.has(job.jobId)) {
          snoozedJobs.add(job.jobId);
          throw snooze(p.ms);
        }
        return ok();
      case "progress":
        job.progress({ percent: p.percent });
        while (!existsSync(p.gate)) {
          try {
            await sleep(20, undefined, { signal: job.signal });
          } catch (e) {
            if (job.signal.aborted) endCancelled(job);
            throw e;
          }
        }
        return ok();
      case "steps": {
        const results = {};
        for (const name of p.steps) {
          results[name] = await job.step(name, () => {
            jobEvent("step", job, { step: name });
            if (name === args["die-at-step"]) die();
            return { by: args["lang-name"], step: name };
          });
        }
        jobEvent("done", job);
        return results;
      }
      case "signup": {
        const key = args.idempotent ? job.idempotencyKey : `${job.jobId}/${job.attempt}`;
        sendEmail(p.user, key, args.idempotent);
        if (p.user === args["die-after-user"]) die();
        return ok();
      }
      default:
        throw new PermanentError(`unknown action ${JSON.stringify(p.action)}`);
    }
  };
}

const leaseMs = Number(args["lease-ms"]);
const worker = new Worker({
  // Several addresses (a cluster's nodes) go to the client options' list, tried in order.
  addresses: args.address.split(",").filter(Boolean),
  // The library's own client options: TLS trusting --ca, mutual TLS with --cert/--key, and the
  // bearer token on every call.
  tls: args.ca,
  clientCert: args.cert,
  clientKey: args.key,
  token: args.token,
  concurrency: Number(args.concurrency),
  prefetch: Number(args.prefetch),
  leaseDurationMs: leaseMs > 0 ? leaseMs : undefined,
  shutdownGraceMs: Number(args["grace-ms"]),
});
for (const queue of args.queues.split(",").filter(Boolean)) worker.handle(queue, handlerFor(queue));

event({ event: "ready" });
try {
  await worker.run(); // until SIGTERM or SIGINT, then the graceful stop
} catch (e) {
  console.error(`conformance_worker.mjs: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
}
event({ event: "stopped" });
process.exit(0);
