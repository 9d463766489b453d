// Worker child processes for the tests that signal or kill them.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import readline from "node:readline";

export interface WorkerProcess {
  proc: ChildProcess;
  /** Resolves once the worker printed "ready" (subscribed). */
  ready: Promise<void>;
  /** Resolves with how the process ended. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stderr: () => string;
}

export function spawnWorker(mode: string, address: string, logFile: string, env: Record<string, string> = {}): WorkerProcess {
  const script = path.join(__dirname, "fixtures/worker_process.js");
  const proc = spawn(process.execPath, [script, mode, address, logFile], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  let err = "";
  proc.stderr!.on("data", (d) => (err += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const lines = readline.createInterface({ input: proc.stdout! });
  const ready = new Promise<void>((resolve, reject) => {
    lines.on("line", (l) => {
      if (l === "ready") resolve();
    });
    void exited.then((e) => reject(new Error(`worker exited before ready (${JSON.stringify(e)}): ${err}`)));
  });
  ready.catch(() => {});
  return { proc, ready, exited, stderr: () => err };
}

/** The lines of a log file (empty if it does not exist yet). */
export function lines(file: string): string[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter((l) => l !== "");
}
