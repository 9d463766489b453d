// Runs the TypeScript sign-up kill-test example (examples/typescript/signup, built by test.sh)
// and checks its table: nobody missed, one duplicate without the idempotency key, none with it.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { repoRoot } from "./broker";

test("the sign-up kill test: 20 emailed, 0 never, 1 duplicate without the key, 0 with it", (t) => {
  const script = path.join(repoRoot(), "examples/typescript/signup/dist/killtest.js");
  assert.ok(existsSync(script), `${script} is missing: build the example first (client/typescript/test.sh does)`);
  const run = spawnSync(process.execPath, [script], { encoding: "utf8", timeout: 240_000 });
  for (const line of run.stdout.trimEnd().split("\n")) t.diagnostic(line);
  assert.equal(run.status, 0, `killtest failed:\n${run.stdout}\n${run.stderr}`);
  const row = (label: string) => {
    const line = run.stdout.split("\n").find((l) => l.startsWith(label));
    assert.ok(line, `no "${label}" row in:\n${run.stdout}`);
    return line.slice(label.length).trim().split(/\s+/).map(Number);
  };
  assert.deepEqual(row("without idempotency key"), [20, 0, 1]);
  assert.deepEqual(row("with idempotency key"), [20, 0, 0]);
});
