// A real etcd (Debian's etcd-server) on free loopback ports with a fresh data directory, for the
// cluster page's tests; stopped (and its directory removed) by stop() or when the process exits.

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';

const etcdBin = process.env.ETCD_BIN || '/usr/bin/etcd';
const READY_TIMEOUT_MS = 30_000;

// A port free right now on 127.0.0.1, below the kernel's ephemeral range (as the C++ harnesses
// pick theirs, tests/testing/process_util.h): a port the kernel picked would be released at once
// and could be taken, before the process given it binds, as the local port of any outgoing
// connection (CI saw a node exit with "No address added" that way).
export async function freePort() {
  let low = 32768;
  try {
    low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || low;
  } catch {
    // not Linux: the default range
  }
  const hi = Math.min(low, 32768) - 1;
  const lo = Math.max(1024, hi - 12000);
  for (let i = 0; i < 100; i++) {
    const port = lo + Math.floor(Math.random() * (hi - lo + 1));
    if (await bindable(port)) return port;
  }
  throw new Error(`no free port in ${lo}..${hi}`);
}

function bindable(port) {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

// Resolves with {url, stop()} once etcd answers /health. `clientPort`: the port its clients
// dial, when they were given its URL before it started.
export async function startEtcd({ clientPort } = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'jobbroker-ui-etcd-'));
  const client = clientPort ?? (await freePort());
  const peer = await freePort();
  const url = `http://127.0.0.1:${client}`;
  const child = spawn(
    etcdBin,
    [
      '--data-dir', path.join(dir, 'data'),
      '--listen-client-urls', url,
      '--advertise-client-urls', url,
      '--listen-peer-urls', `http://127.0.0.1:${peer}`,
      '--initial-advertise-peer-urls', `http://127.0.0.1:${peer}`,
      '--initial-cluster', `default=http://127.0.0.1:${peer}`,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', () => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    try {
      const response = await fetch(`${url}/health`);
      if (response.ok) break;
    } catch {
      // Not listening yet.
    }
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`etcd did not become healthy at ${url}\n${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, stop };
}
