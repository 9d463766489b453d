// The sign-up kill test: why a durable broker exists.
//
// For a run without and a run with the idempotency key: start a broker, enqueue 20 welcome
// emails, start worker 1, which SIGKILLs itself right after user_6's email was sent and before
// the ack; start worker 2, which takes over once user_6's 1 s lease has run out; wait until all
// 20 jobs are COMPLETED and count the emails in the fake provider's outbox.
// Expected: nobody is missed; without the key user_6 gets two emails, with it nobody does.
// Exits non-zero if a run differs from that.
//
//   node dist/killtest.js      (JOBBROKER_BIN: the broker binary, default <repo>/build/server/jobbroker)
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { Client, JobState } from "@jobbroker/client";
import { emailsPerUser } from "./provider";

const USERS = 20;
const DIE_AFTER = "user_6";
const repoRoot = path.resolve(__dirname, "../../../..");
const brokerBin = process.env.JOBBROKER_BIN || path.join(repoRoot, "build/server/jobbroker");
const config = {
  defaultPolicy: { retry: { maxAttempts: 5, initialBackoff: "0.1s", maxBackoff: "0.1s", jitter: "JITTER_NONE" } },
};

interface Row {
  emailed: number;
  never: number;
  duplicates: number;
}

function exited(p: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (p.exitCode !== null || p.signalCode !== null) return Promise.resolve({ code: p.exitCode, signal: p.signalCode });
  return new Promise((resolve) => p.once("exit", (code, signal) => resolve({ code, signal })));
}

async function startBroker(dir: string): Promise<{ proc: ChildProcess; address: string }> {
  writeFileSync(path.join(dir, "config.json"), JSON.stringify(config));
  const proc = spawn(
    brokerBin,
    ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir", path.join(dir, "data"),
      "--config", path.join(dir, "config.json"), "--log-level", "warn"],
    { stdio: ["ignore", "pipe", openSync(path.join(dir, "broker.log"), "a")] },
  );
  const lines = readline.createInterface({ input: proc.stdout! });
  const address = await new Promise<string>((resolve, reject) => {
    proc.once("error", reject);
    proc.once("exit", (code) => reject(new Error(`broker ${brokerBin} exited with ${code}`)));
    lines.on("line", (line) => {
      const m = /^jobbroker: serving grpc=(\S+)/.exec(line);
      if (m) resolve(m[1]);
    });
  });
  return { proc, address };
}

function node(script: string, args: string[]): ChildProcess {
  return spawn(process.execPath, [path.join(__dirname, script), ...args], { stdio: ["ignore", "ignore", "inherit"] });
}

async function poll(what: string, fn: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const giveUp = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > giveUp) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function run(idempotent: boolean): Promise<Row> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "jobbroker-signup-"));
  const broker = await startBroker(dir);
  const client = new Client(broker.address);
  const workers: ChildProcess[] = [];
  let finished = false;
  try {
    const producer = node("producer.js", ["--address", broker.address, "--users", String(USERS)]);
    const produced = await exited(producer);
    if (produced.code !== 0) throw new Error(`the producer failed: ${JSON.stringify(produced)}`);

    const outbox = path.join(dir, "outbox.txt");
    const args = ["--address", broker.address, "--outbox", outbox, ...(idempotent ? ["--idempotent"] : [])];
    const first = node("worker.js", [...args, "--die-after", DIE_AFTER]);
    workers.push(first);
    const died = await exited(first);
    if (died.signal !== "SIGKILL") throw new Error(`worker 1 should have killed itself after ${DIE_AFTER}: ${JSON.stringify(died)}`);
    // user_6 was emailed but never acked: the broker still holds it ACTIVE until its lease runs out.
    const active = await client.listJobs("signups", { state: JobState.JOB_STATE_ACTIVE });
    const held = active.jobs.map((j) => j.payload.toString());
    if (held.length !== 1 || held[0] !== DIE_AFTER) throw new Error(`expected only ${DIE_AFTER} ACTIVE, got ${JSON.stringify(held)}`);

    const second = node("worker.js", args);
    workers.push(second);
    await poll("all signups to complete", async () => {
      const q = await client.getQueue("signups");
      return Number(q.counts[JobState[JobState.JOB_STATE_COMPLETED]] ?? 0) === USERS;
    });
    second.kill("SIGTERM");
    const stopped = await exited(second);
    if (stopped.code !== 0) throw new Error(`worker 2 did not stop cleanly: ${JSON.stringify(stopped)}`);

    const emails = emailsPerUser(outbox);
    const row: Row = { emailed: 0, never: 0, duplicates: 0 };
    for (let i = 1; i <= USERS; i++) {
      const n = emails.get(`user_${i}`) ?? 0;
      if (n === 0) row.never++;
      else row.emailed++;
      row.duplicates += Math.max(0, n - 1);
    }
    finished = true;
    return row;
  } finally {
    for (const w of workers) if (w.exitCode === null && w.signalCode === null) w.kill("SIGKILL");
    client.close();
    broker.proc.kill("SIGTERM");
    await exited(broker.proc);
    if (finished) rmSync(dir, { recursive: true, force: true });
    else console.error(`killtest: the run's files (broker.log, outbox.txt) are kept in ${dir}`);
  }
}

async function main(): Promise<void> {
  const without = await run(false);
  const withKey = await run(true);
  const pad = (s: string | number, n: number) => String(s).padStart(n);
  console.log(`${"".padEnd(26)}${pad("emailed", 9)}${pad("never emailed", 15)}${pad("duplicates", 12)}`);
  for (const [name, r] of [["without idempotency key", without], ["with idempotency key", withKey]] as const) {
    console.log(`${name.padEnd(26)}${pad(r.emailed, 9)}${pad(r.never, 15)}${pad(r.duplicates, 12)}`);
  }
  const ok =
    without.emailed === USERS && without.never === 0 && without.duplicates === 1 &&
    withKey.emailed === USERS && withKey.never === 0 && withKey.duplicates === 0;
  console.log(ok ? "kill test: OK" : "kill test: FAILED (expected 20 emailed, 0 never, 1 duplicate without the key, 0 with it)");
  process.exitCode = ok ? 0 : 1;
}

main().catch((e) => {
  console.error(`killtest: ${e instanceof Error ? e.stack : e}`);
  process.exit(1);
});
