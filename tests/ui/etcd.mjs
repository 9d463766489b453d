// A real etcd (Debian's etcd-server) on free loopback ports with a fresh data directory, for the
// cluster page's tests; stopped (and its directory removed) by stop() or when the process exits.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';

const etcdBin = process.env.ETCD_BIN || '/usr/bin/etcd';
const READY_TIMEOUT_MS = 30_000;

// A port free right now on 127.0.0.1 (the kernel's pick, released at once).
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

// Resolves with {url, stop()} once etcd answers /health.
export async function startEtcd() {
  const dir = mkdtempSync(path.join(tmpdir(), 'jobbroker-ui-etcd-'));
  const client = await freePort();
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
