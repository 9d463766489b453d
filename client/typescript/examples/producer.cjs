// A producer (CommonJS): enqueues one email job and waits for a worker to complete it.
//
//   npm install @jobbroker/client
//   JOBBROKER_ADDRESS=127.0.0.1:7070 node producer.cjs [queue] [to]
//
// The connection comes from the environment like worker.mjs's: $JOBBROKER_ADDRESS,
// $JOBBROKER_TOKEN and, for TLS, $JOBBROKER_CA. Exits 0 when the job is COMPLETED.
const { Client, JobEndedError } = require("@jobbroker/client");

async function main() {
  const [queue = "emails", to = "ada@example.com"] = process.argv.slice(2);
  const client = new Client({ tls: process.env.JOBBROKER_CA || undefined });
  try {
    // Enqueue, then watch the job until it ends (rejects with JobEndedError if it FAILED).
    const job = await client.enqueueAndWait(queue, { to }, { waitTimeoutMs: 30_000 });
    console.log(`completed ${job.id}: ${job.result.toString()}`);
  } finally {
    client.close();
  }
}
main().catch((e) => {
  console.error(e instanceof JobEndedError ? `job ${e.job.id} ended ${e.state}: ${e.job.lastError}` : e);
  process.exit(1);
});
