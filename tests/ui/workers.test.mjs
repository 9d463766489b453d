// The workers page (#/workers): a worker that leased a job and reports progress, one whose Lease
// call waits for a job, the queue filter reached from a queue's page, and the link to a running
// job. Checked against what the broker holds, through gRPC.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, openPage, screenshot } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { connect, enqueue, leaseJob } from './grpc.mjs';

let dash;
let client;
let browser;
let renderId;
let waiting;

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  renderId = await enqueue(client, 'renders', JSON.stringify({ frame: 1 }));
  const leased = await leaseJob(client, 'renders', renderId, 'gpu-7');
  await client.broker.heartbeat({ jobId: renderId, leaseId: leased.leaseId, progress: Buffer.from('{"percent": 40}') });
  // A Lease that waits for a job of an empty queue (below the helper's 15 s deadline); a job
  // enqueued in after() answers it.
  waiting = client.broker.lease({ queue: 'thumbnails', workerId: 'poller-2', maxJobs: 1, wait: { seconds: 14 } });
});

after(async () => {
  await enqueue(client, 'thumbnails', 'wake');
  await waiting?.catch(() => {});
  await browser?.close();
  client?.close();
  await dash?.stop();
});

test('lists each worker with its queues, connections and the jobs it runs, with progress', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Workers' }).click();
  await page.getByRole('heading', { level: 1, name: 'Workers' }).waitFor();
  await page.getByText('2 workers, 1 job running').waitFor();
  assert.equal(await page.getByRole('link', { name: 'Workers' }).getAttribute('aria-current'), 'page');

  const table = page.getByRole('region', { name: 'Workers table' });
  const gpu = table.locator('tr[data-worker="gpu-7"]');
  assert.match(await gpu.textContent(), /gpu-7\s*renders\s*none\s*1/);
  assert.equal(await gpu.getByRole('progressbar', { name: 'Progress 40%' }).count(), 1);
  const poller = table.locator('tr[data-worker="poller-2"]');
  assert.match(await poller.textContent(), /poller-2\s*thumbnails\s*1\s*0/);
  assert.match(await poller.textContent(), /idle/);
  await screenshot(page, 'workers');

  await gpu.getByRole('link', { name: renderId }).click();
  await page.getByRole('heading', { level: 1, name: new RegExp(renderId) }).waitFor();
  assert.deepEqual(page.problems, []);
});

test("a queue's page links to the workers of that queue only", async () => {
  const page = await openPage(browser, dash.url, { hash: '#/queues/thumbnails' });
  await page.getByRole('heading', { level: 1, name: 'Queue thumbnails' }).waitFor();
  await page.getByRole('link', { name: '1', exact: true }).click();
  await page.getByRole('heading', { level: 1, name: 'Workers of thumbnails' }).waitFor();
  await page.getByText('1 worker, 0 jobs running').waitFor();
  const rows = page.getByRole('region', { name: 'Workers table' }).locator('tbody tr');
  assert.equal(await rows.count(), 1);
  assert.equal(await rows.first().getAttribute('data-worker'), 'poller-2');
  assert.deepEqual(page.problems, []);
});
