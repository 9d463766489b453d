// Sends each new user a welcome email through the fake provider.
//   node dist/worker.js [--address HOST:PORT] --outbox FILE [--die-after USER] [--idempotent]
// --die-after USER: SIGKILL this process right after USER's email was sent, before the ack.
// --idempotent: pass the job's idempotency key to the provider, which skips keys it has seen.
import { Worker } from "@jobbroker/client";
import { sendWelcomeEmail } from "./provider";

const args = process.argv.slice(2);
const opt = (name: string) => (args.includes(name) ? args[args.indexOf(name) + 1] : undefined);
const outbox = opt("--outbox");
const dieAfter = opt("--die-after");
const idempotent = args.includes("--idempotent");
if (!outbox) {
  console.error("usage: worker.js [--address HOST:PORT] --outbox FILE [--die-after USER] [--idempotent]");
  process.exit(2);
}

const worker = new Worker({ address: opt("--address"), concurrency: 1, leaseDurationMs: 1000 });
worker.handle("signups", async (job) => {
  const user = job.text();
  // Without --idempotent the provider is handed no usable key: every call sends.
  const key = idempotent ? job.idempotencyKey : `${job.jobId}/${job.attempt}`;
  await sendWelcomeEmail(outbox, user, key, idempotent);
  if (user === dieAfter) process.kill(process.pid, "SIGKILL"); // after the email, before the ack
});
worker.run().catch((e) => {
  console.error(`worker: ${e instanceof Error ? e.message : e}`);
  process.exit(1);
});
