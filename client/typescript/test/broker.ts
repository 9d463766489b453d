// Starts the real jobbroker binary for a test: port 0, a fresh data dir, optional config.
import { spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import { createWriteStream, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";

/** <repo root>, from this file's place: dist/test/ or test/ under client/typescript. */
export function repoRoot(): string {
  let dir = __dirname;
  while (path.basename(dir) !== "typescript" || path.basename(path.dirname(dir)) !== "client") {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`cannot find client/typescript above ${__dirname}`);
    dir = up;
  }
  return path.resolve(dir, "../..");
}

export function brokerBinary(): string {
  return process.env.JOBBROKER_BIN || path.join(repoRoot(), "build/server/jobbroker");
}

export interface BrokerOptions {
  config?: unknown;
  /** Reuse this data dir (a restart); default a fresh temp dir. */
  dataDir?: string;
  /** "127.0.0.1:PORT"; default port 0. */
  listen?: string;
  /** More command-line flags (--tls-cert FILE, --auth-tokens FILE, ...). */
  args?: string[];
}

export class Broker {
  private exited: Promise<number | null>;
  private constructor(
    readonly proc: ChildProcess,
    readonly address: string,
    /** Where it serves /metrics ("127.0.0.1:PORT"). */
    readonly httpAddress: string,
    readonly dataDir: string,
    readonly tempDir: string,
  ) {
    this.exited = new Promise((resolve) => {
      if (proc.exitCode !== null) resolve(proc.exitCode);
      else proc.once("exit", (code) => resolve(code));
    });
  }

  static async start(options: BrokerOptions = {}, tempDir?: string): Promise<Broker> {
    const dir = tempDir ?? mkdtempSync(path.join(os.tmpdir(), "jobbroker-ts-"));
    const dataDir = options.dataDir ?? path.join(dir, "data");
    const args = ["--listen", options.listen ?? "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "warn"];
    if (options.config !== undefined) {
      const config = path.join(dir, "config.json");
      writeFileSync(config, JSON.stringify(options.config));
      args.push("--config", config);
    }
    args.push(...(options.args ?? []));
    const proc = spawn(brokerBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
    const log = createWriteStream(path.join(dir, "broker.log"), { flags: "a" });
    proc.stderr!.pipe(log);
    const lines = readline.createInterface({ input: proc.stdout! });
    const [address, httpAddress] = await new Promise<[string, string]>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the broker did not report its address within 30 s")), 30_000);
      proc.once("error", (e) => { clearTimeout(timer); reject(e); });
      proc.once("exit", (code) => { clearTimeout(timer); reject(new Error(`the broker exited with ${code}; see ${dir}/broker.log`)); });
      lines.on("line", (line) => {
        const m = /^jobbroker: serving grpc=(\S+) http=(\S+)/.exec(line);
        if (m) { clearTimeout(timer); resolve([m[1], m[2]]); }
      });
    });
    lines.on("line", () => {}); // keep draining stdout
    return new Broker(proc, address, httpAddress, dataDir, dir);
  }

  /** Its /metrics, as text. */
  metrics(): Promise<string> {
    return new Promise((resolve, reject) => {
      const request = http.get(`http://${this.httpAddress}/metrics`, { timeout: 5000 }, (answer) => {
        let text = "";
        answer.setEncoding("utf8");
        answer.on("data", (chunk: string) => (text += chunk));
        answer.on("end", () => resolve(text));
      });
      request.on("timeout", () => request.destroy(new Error("/metrics did not answer")));
      request.on("error", reject);
    });
  }

  /**
   * How many unary calls of Broker/`method` ("Enqueue", "EnqueueBatch") the broker answered, with
   * status `code` ("OK", "INVALID_ARGUMENT") or with any: its jobbroker_rpc_duration_seconds_count.
   */
  async rpcCount(method: string, code?: string): Promise<number> {
    let n = 0;
    for (const line of (await this.metrics()).split("\n")) {
      if (!line.startsWith("jobbroker_rpc_duration_seconds_count{")) continue;
      if (!line.includes(`method="/jobbroker.v1.Broker/${method}"`)) continue;
      if (code !== undefined && !line.includes(`code="${code}"`)) continue;
      n += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
    return n;
  }

  /** SIGTERM (graceful); resolves with the exit code. */
  async stop(): Promise<number | null> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGTERM");
    return this.exited;
  }

  /** SIGKILL. */
  async kill(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
    await this.exited;
  }

  /** stop() and remove the temp dir. */
  async dispose(): Promise<void> {
    await this.stop();
    rmSync(this.tempDir, { recursive: true, force: true });
  }
}

/** Polls `fn` every 50 ms until it returns a truthy value; gives up after `timeoutMs`. */
export async function eventually<T>(fn: () => Promise<T> | T, what: string, timeoutMs = 30_000): Promise<NonNullable<T>> {
  const giveUp = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    if (Date.now() > giveUp) throw new Error(`gave up waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
