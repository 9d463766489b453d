// The cluster page (#/cluster): on a single node, and on a real three-node cluster (a real etcd,
// three real jobbroker processes) where a partition's leader is killed with SIGKILL and the page
// shows the failover: the node down, the partition led by another node, the change logged, and
// after the node's restart every replica back in sync.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { eventually, launch, openPage, screenshot } from './browser.mjs';
import { startBroker } from './broker.mjs';
import { startDashboard } from './dashboard.mjs';
import { freePort, startEtcd } from './etcd.mjs';
import { connect, enqueue } from './grpc.mjs';

// Failover waits for the dead node's etcd lease (2 s here) and an election; restarts catch up.
const FAILOVER_TIMEOUT_MS = 45_000;

let browser;
before(async () => {
  browser = await launch();
});
after(async () => {
  await browser?.close();
});

describe('a single node', () => {
  let dash;
  before(async () => {
    dash = await startDashboard();
  });
  after(async () => {
    await dash?.stop();
  });

  test('says it is a single node and lists its partition, led by itself', async () => {
    const page = await openPage(browser, dash.url);
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Cluster' }).click();
    await page.getByRole('heading', { level: 1, name: 'Cluster' }).waitFor();
    await page.getByText(/^A single node: 1 partition/).waitFor();
    const partitions = page.getByRole('region', { name: 'Partitions table' });
    const row = partitions.getByRole('row').nth(1);
    assert.match(await row.textContent(), /^0\s*local\s*0.*OK$/);
    assert.equal(await page.getByRole('link', { name: 'Cluster' }).getAttribute('aria-current'), 'page');
    assert.deepEqual(page.problems, []);
  });
});

describe('a three-node cluster', () => {
  let etcd;
  let root;
  const ports = [];
  const nodes = [];
  let client;

  // A port picked free may still be taken before the node binds it (by another suite running
  // at the same time): the node then exits with gRPC's "No address added". It starts again on
  // another port; peers dial the address it registers in etcd, so a node restarted on a new one
  // rejoins all the same.
  const startNode = async (n) => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await startNodeOn(n);
      } catch (err) {
        if (attempt === 3 || !/No address added/.test(err.message)) throw err;
        ports[n] = await freePort();
      }
    }
  };
  const startNodeOn = (n) =>
    startBroker({
      listen: `127.0.0.1:${ports[n]}`,
      dataDir: path.join(root, `node-${n}`),
      args: () => [
        '--cluster-etcd', etcd.url,
        '--node-id', `node-${n}`,
        '--partitions', '3',
        '--replication-factor', '3',
        '--min-in-sync', '2',
        '--cluster-lease-ttl', '2',
      ],
    });

  before(async () => {
    root = mkdtempSync(path.join(tmpdir(), 'jobbroker-ui-cluster-'));
    etcd = await startEtcd();
    for (let n = 0; n < 3; n++) ports.push(await freePort());
    for (let n = 0; n < 3; n++) nodes.push(await startNode(n));
    client = connect(nodes[0].grpc);
  });
  after(async () => {
    client?.close();
    for (const node of nodes) await node?.stop();
    await etcd?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  test('the page shows a leader being killed, the failover, and the rejoin', async () => {
    // Every partition fully in sync and led by its preferred replica (the first node to start may
    // lead them all for a few seconds, until it hands each back) before anything is killed.
    const healthy = async () => {
      const cluster = await client.admin.getCluster({});
      return (
        cluster.nodes.filter((n) => n.alive).length === 3 &&
        cluster.partitions.length === 3 &&
        cluster.partitions.every((p) => p.leaderNodeId === p.replicas[0] && p.inSync.length === 3) &&
        cluster
      );
    };
    const before = await eventually(
      'three nodes, every partition in sync and led by its preferred replica',
      healthy,
      FAILOVER_TIMEOUT_MS,
    );
    // A job on every partition's queue goes through whichever node leads it. A leader etcd has
    // just named may still be rebuilding its partition: UNAVAILABLE ("retry"), as a client retries.
    for (const q of ['alpha', 'beta', 'gamma']) {
      await eventually(
        `an enqueue to ${q}`,
        async () => {
          try {
            return await enqueue(client, q, '{}');
          } catch (err) {
            if (err.code === 14 /* UNAVAILABLE */) return false;
            throw err;
          }
        },
        FAILOVER_TIMEOUT_MS,
      );
    }

    const page = await openPage(browser, nodes[0].url, { hash: '#/cluster' });
    const unavailable = []; // [phase, url] of every 503
    let phase = 'healthy';
    page.on('response', (r) => {
      if (r.status() === 503) unavailable.push([phase, new URL(r.url()).pathname]);
    });
    await page.getByText('Every partition has a leader and all its replicas in sync.').waitFor();
    const nodesTable = page.getByRole('region', { name: 'Nodes table' });
    const partitionsTable = page.getByRole('region', { name: 'Partitions table' });
    assert.equal(await nodesTable.getByRole('row').count(), 4); // a header and three nodes
    await page.getByText(/^Cluster “jobbroker” · 3 nodes, 3 up · 3 partitions · replication factor 3/).waitFor();
    await screenshot(page, 'cluster', { fullPage: true });

    // Kill (-9) a node other than the one serving the page that leads at least one partition.
    const victim = before.partitions.map((p) => p.leaderNodeId).find((id) => id !== 'node-0');
    assert.ok(victim, `some partition is led by node-1 or node-2: ${JSON.stringify(before.partitions)}`);
    const led = before.partitions.filter((p) => p.leaderNodeId === victim).map((p) => p.partition);
    phase = 'failover';
    await nodes[Number(victim.slice(5))].kill();

    // The page logs each of its partitions moving to another node, and shows it down.
    for (const partition of led) {
      await page
        .getByRole('listitem')
        .filter({ hasText: new RegExp(`Partition ${partition} led by node-\\d \\(was ${victim}\\)|Partition ${partition} led by node-\\d, epoch`) })
        .first()
        .waitFor({ timeout: FAILOVER_TIMEOUT_MS });
      const row = partitionsTable.locator(`tr[data-partition="${partition}"]`);
      const leader = (await row.getByRole('cell').first().textContent()).trim();
      assert.match(leader, /^node-\d$/);
      assert.notEqual(leader, victim);
    }
    await nodesTable.locator(`tr[data-node="${victim}"]`).getByText('Down').waitFor({ timeout: FAILOVER_TIMEOUT_MS });
    // Two of three replicas in sync: under-replicated, and still taking writes.
    await page.getByText(/under-replicated \(fewer than 3 replicas in sync\)/).waitFor({ timeout: FAILOVER_TIMEOUT_MS });
    for (const q of ['alpha', 'beta', 'gamma']) await enqueue(client, q, '{}');
    await screenshot(page, 'cluster-failover', { fullPage: true });
    phase = 'after';

    // Restarted on its data, the node catches up and every replica is in sync again.
    const n = Number(victim.slice(5));
    nodes[n] = await startNode(n);
    await page.getByText('Every partition has a leader and all its replicas in sync.').waitFor({ timeout: FAILOVER_TIMEOUT_MS });
    await nodesTable.locator(`tr[data-node="${victim}"]`).getByText('Up').waitFor();
    // While a partition has no leader the queue list (which reads every partition) answers
    // 503, which the browser logs; the cluster page itself never fails, and nothing else does.
    for (const [when, url] of unavailable) assert.deepEqual([when, url], ['failover', '/api/v1/queues']);
    const problems = page.problems.filter((p) => !/status of 503/.test(p));
    assert.equal(page.problems.length - problems.length, unavailable.length);
    assert.deepEqual(problems, []);
  });
});
