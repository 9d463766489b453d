// An email worker (ESM). Each job's payload is JSON like {"to": "ada@example.com"}; the handler
// "sends" it and returns {"sent": to} as the job's result. A job without "to" fails permanently.
//
//   npm install @jobbroker/client
//   JOBBROKER_ADDRESS=127.0.0.1:7070 node worker.mjs [queue] [--once]
//
// The connection comes from the environment: $JOBBROKER_ADDRESS, $JOBBROKER_TOKEN (a bearer
// token) and, for TLS, $JOBBROKER_CA (the CA's PEM file). --once stops the worker gracefully
// after its first completed job (the package's install test uses it). SIGTERM or SIGINT stops it
// gracefully too: no new jobs, unstarted ones released, running ones finished and acked, exit 0.
import { PermanentError, Worker, clientName } from "@jobbroker/client";

const queue = process.argv.slice(2).find((a) => !a.startsWith("--")) ?? "emails";
const once = process.argv.includes("--once");

const worker = new Worker({
  tls: process.env.JOBBROKER_CA || undefined, // address and token: from the environment
  concurrency: 2,
});
worker.handle(queue, async (job) => {
  const { to } = job.json();
  if (!to) throw new PermanentError("no address"); // FAILED at once, no retry
  console.log(`sent ${job.jobId} to ${to} key=${job.idempotencyKey} attempt=${job.attempt} (${clientName})`);
  if (once) setImmediate(() => void worker.stop());
  return { sent: to }; // kept as the job's result
});
await worker.run(); // until SIGTERM/SIGINT (or --once), then a graceful stop
