// Starts the real broker binary on free ports with a fresh data directory, and stops it again
// (also when a test failed or the test process dies).

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const brokerBin = process.env.JOBBROKER_BIN || path.join(repoRoot, 'build/server/jobbroker');

const READY_TIMEOUT_MS = 30_000;
const STOP_GRACE_MS = 10_000;

// Every broker still running when the process exits is killed and its directory removed,
// whatever the reason (a failed hook, Ctrl-C, the runner's timeout).
const running = new Map(); // child process -> its temporary directory
process.on('exit', () => {
  for (const [child, dir] of running) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
for (const signal of ['SIGINT', 'SIGTERM']) process.once(signal, () => process.exit(1));

// `files`: name -> contents, written into the broker's temporary directory before it starts;
// `args(dir)`: extra flags, given that directory (e.g. --auth-tokens <dir>/tokens.json);
// `listen`: the gRPC address (a cluster node needs a fixed one the others can dial);
// `httpListen`: the HTTP address (a fixed one to open the dashboard before the broker serves);
// `dataDir`: a data directory of the caller's, kept after stop (a node restarted on its data);
// `readyTimeoutMs`: how long it may take to serve (a node that waits for a test's etcd).
// Resolves with {grpc, http, url, dir, stop(), kill()} once the broker printed its "serving"
// line; kill() is kill -9.
export async function startBroker({
  files = {},
  args = () => [],
  listen = '127.0.0.1:0',
  httpListen = '127.0.0.1:0',
  dataDir = null,
  readyTimeoutMs = READY_TIMEOUT_MS,
} = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'jobbroker-ui-'));
  for (const [name, contents] of Object.entries(files)) writeFileSync(path.join(dir, name), contents);
  const argv = [
    '--listen', listen,
    '--http-listen', httpListen,
    '--data-dir', dataDir ?? path.join(dir, 'data'),
    '--log-level', 'warn',
    ...args(dir),
  ];
  const child = spawn(brokerBin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.set(child, dir);
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr = (stderr + d.toString()).slice(-8000);
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  exited.then(() => running.delete(child));

  const cleanup = () => rmSync(dir, { recursive: true, force: true });
  let addresses;
  try {
    addresses = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`broker not serving after ${readyTimeoutMs} ms`)), readyTimeoutMs);
      child.once('error', (err) => reject(new Error(`cannot start ${brokerBin}: ${err.message}`)));
      exited.then((e) => reject(new Error(`broker exited before serving (${JSON.stringify(e)})`)));
      readline.createInterface({ input: child.stdout }).on('line', (line) => {
        const m = /^jobbroker: serving grpc=(\S+) http=(\S+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          resolve({ grpc: m[1], http: m[2] });
        }
      });
    });
  } catch (err) {
    child.kill('SIGKILL');
    await exited;
    cleanup();
    throw new Error(`${err.message}\n${stderr}`);
  }

  async function stop() {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
      await exited;
      clearTimeout(timer);
    }
    cleanup();
  }

  async function kill() {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await exited;
    }
    cleanup();
  }

  return { ...addresses, url: `http://${addresses.http}`, dir, stop, kill, stderr: () => stderr };
}
