// The TypeScript client's interop worker (plain ESM, no build step): runs durable steps "a", "b",
// "c" for every job of --queue. Each step appends "<lang-name> <step>" to --record (fsynced) and
// returns a JSON value; with --die-at STEP the process SIGKILLs itself right after recording
// that step. The job's result is {"a": ..., "b": ..., "c": ...} as job.step() returned them.
import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";

// The package's ESM build (what `import "@jobbroker/client"` loads: the "import" condition of
// client/typescript/package.json's exports), built by client/typescript/test.sh.
import { Worker } from "../../../client/typescript/dist/esm/index.js";

const STEPS = ["a", "b", "c"];

const { values: args } = parseArgs({
  options: {
    address: { type: "string" },
    queue: { type: "string" },
    record: { type: "string" },
    "lang-name": { type: "string" },
    "die-at": { type: "string" },
  },
});
for (const k of ["address", "queue", "record", "lang-name"]) {
  if (!args[k]) {
    console.error("usage: worker.mjs --address HOST:PORT --queue Q --record FILE --lang-name NAME [--die-at STEP]");
    process.exit(2);
  }
}
const lang = args["lang-name"];

// Must match expected_step() in ../steps_interop.py and the other workers.
function stepValue(step) {
  const n = STEPS.indexOf(step) + 1;
  return { by: lang, step, n, nested: { half: n + 0.5, list: [n, "x", true, null], text: "h\u00e9llo \u2713" } };
}

function record(line) {
  const fd = openSync(args.record, "a");
  try {
    writeSync(fd, line + "\n");
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

const worker = new Worker({ address: args.address, concurrency: 1 });
worker.handle(args.queue, async (job) => {
  const results = {};
  for (const step of STEPS) {
    results[step] = await job.step(step, () => {
      record(`${lang} ${step}`);
      if (step === args["die-at"]) process.kill(process.pid, "SIGKILL");
      return stepValue(step);
    });
  }
  return results;
});
await worker.run();
