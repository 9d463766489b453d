// The dashboard of a broker that is still starting: its HTTP server answers before the API does
// (a recovery of millions of jobs, a cluster node waiting for etcd). The header says Starting,
// not Offline, and the overview says how far the start got; both turn to the queues once it
// serves. The node here waits for an etcd that is started only after the page was checked.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { eventually, launch, openPage, screenshot } from './browser.mjs';
import { startBroker } from './broker.mjs';
import { freePort, startEtcd } from './etcd.mjs';
import { connect, enqueue } from './grpc.mjs';

let browser;
let etcd;
let node;
let client;
before(async () => {
  browser = await launch();
});
after(async () => {
  client?.close();
  await browser?.close();
  await (await node?.catch(() => null))?.stop();
  await etcd?.stop();
});

test('a starting broker shows Starting and how far it got, then its queues once it serves', async () => {
  const etcdPort = await freePort();
  const httpPort = await freePort();
  // Not awaited: it resolves once the node serves, which needs the etcd started below.
  node = startBroker({
    httpListen: `127.0.0.1:${httpPort}`,
    readyTimeoutMs: 120_000,
    args: () => [
      '--cluster-etcd', `http://127.0.0.1:${etcdPort}`,
      '--cluster-etcd-wait', '120',
      '--node-id', 'node-0',
      '--partitions', '2',
      '--replication-factor', '1',
      '--min-in-sync', '1',
    ],
  });
  const url = `http://127.0.0.1:${httpPort}`;
  await eventually('the starting broker’s HTTP server', async () => (await fetch(`${url}/healthz`)).ok);

  const page = await openPage(browser, url);
  const live = page.locator('#live');
  await eventually('the header to say Starting', async () => (await live.textContent()) === 'Starting');
  assert.match(await live.getAttribute('class'), /\bstarting\b/);
  assert.doesNotMatch(await live.getAttribute('class'), /\boffline\b/);
  const notice = page.getByRole('alert');
  await notice
    .getByText(
      `The broker is starting (joining the cluster through etcd at http://127.0.0.1:${etcdPort}). ` +
        'The queues appear once it serves.',
      { exact: true },
    )
    .waitFor();
  assert.match(await notice.getAttribute('class'), /\bwarn\b/);
  await screenshot(page, 'starting');

  etcd = await startEtcd({ clientPort: etcdPort });
  const serving = await node;
  client = connect(serving.grpc);
  // A partition just led may still be rebuilding: UNAVAILABLE ("retry"), as a client retries.
  await eventually('an enqueue', async () => {
    try {
      return await enqueue(client, 'emails', '{}');
    } catch (err) {
      if (err.code === 14 /* UNAVAILABLE */) return false;
      throw err;
    }
  });
  await eventually('the header to say Live', async () => (await live.textContent()) === 'Live');
  await page.getByRole('link', { name: 'emails' }).first().waitFor();
  assert.equal(await notice.count(), 0, 'the notice is gone once the broker serves');
});
