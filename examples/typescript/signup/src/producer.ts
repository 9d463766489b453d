// Enqueues a welcome email for user_1..user_N to the "signups" queue. The dedup key makes a
// second run harmless, and the broker hands it to every attempt as the job's idempotency key.
//   node dist/producer.js [--address HOST:PORT] [--users N]
import { Client } from "@jobbroker/client";

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const opt = (name: string) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const client = new Client({ address: opt("--address") });
  const users = Number(opt("--users") ?? 20);
  try {
    const results = await client.enqueueBatch(
      Array.from({ length: users }, (_, i) => ({
        queue: "signups",
        payload: `user_${i + 1}`,
        dedupKey: `welcome:user_${i + 1}`,
      })),
    );
    for (const [i, r] of results.entries()) {
      console.log(`user_${i + 1} -> job ${r.jobId}${r.deduplicated ? " (already enqueued)" : ""}`);
    }
  } finally {
    client.close();
  }
}

main().catch((e) => {
  console.error(`producer: ${e instanceof Error ? e.message : e}`);
  process.exit(1);
});
