// The failed-jobs view: dead jobs grouped by error across queues, and the bulk retry of a
// queue's dead jobs checked through gRPC.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, openPage, screenshot } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { connect, deadJob, enqueue } from './grpc.mjs';

let dash;
let client;
let browser;
const SAME = 'connect ECONNREFUSED 10.0.0.7:443';
const OTHER = 'invalid signature\n  at verify (hooks.js:12)';
const dead = {};

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  dead.alpha = await deadJob(client, 'alpha', SAME);
  dead.beta = await deadJob(client, 'beta', SAME);
  dead.other = await deadJob(client, 'beta', OTHER);
  await enqueue(client, 'alpha', '{}');
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

test('dead jobs with the same error form one group', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Failed jobs' }).click();
  await page.getByRole('heading', { level: 1, name: 'Failed jobs' }).waitFor();

  const groups = page.getByRole('article');
  await groups.nth(1).waitFor();
  assert.equal(await groups.count(), 2);
  // The largest group first, named by its count and error.
  const first = groups.first();
  assert.equal(await first.getByRole('heading').textContent(), `2 jobs ${SAME}`);
  assert.match(await first.textContent(), /Queues\s*alpha \(1\), beta \(1\)|Queues\s*beta \(1\), alpha \(1\)/);
  await first.getByRole('link', { name: dead.alpha }).waitFor();
  await first.getByRole('link', { name: dead.beta }).waitFor();
  const second = groups.nth(1);
  assert.equal(await second.getByRole('heading').textContent(), '1 job invalid signature');
  // A multi-line error is shown whole under its first line.
  assert.equal(await second.locator('pre').textContent(), OTHER);

  // The queue table counts every queue's dead jobs.
  const byQueue = page.getByRole('region', { name: 'Dead jobs by queue' });
  assert.match(await byQueue.getByRole('row').filter({ hasText: 'beta' }).textContent(), /beta\s*2/);
  await screenshot(page, 'failed', { fullPage: true });
  assert.deepEqual(page.problems, []);
});

test('“Retry all dead jobs” of a queue redrives only that queue', async () => {
  const page = await openPage(browser, dash.url, { hash: '#/failed' });
  await page.getByRole('button', { name: 'Retry all dead jobs of queue alpha' }).click();
  const dialog = page.getByRole('dialog', { name: 'Retry dead jobs of alpha?' });
  await dialog.waitFor();
  assert.match(await dialog.textContent(), /1 dead job goes back to ready/);
  await dialog.getByRole('button', { name: 'Confirm' }).click();
  await page.getByRole('status').filter({ hasText: 'Retried 1 dead job of queue alpha.' }).waitFor();
  assert.equal((await client.admin.getJob({ jobId: dead.alpha })).state, 'JOB_STATE_READY');
  assert.equal((await client.admin.getJob({ jobId: dead.beta })).state, 'JOB_STATE_FAILED');
  assert.equal((await client.admin.getJob({ jobId: dead.other })).state, 'JOB_STATE_FAILED');
  // The view reloads: the group of two is now a group of one, in beta only.
  await page.getByRole('heading', { name: new RegExp(`^1 job\\s+${SAME.replaceAll('.', '\\.')}$`) }).waitFor();
  assert.equal(await page.getByRole('button', { name: 'Retry all dead jobs of queue alpha' }).count(), 0);
  assert.deepEqual(page.problems, []);
});

test('a group’s own Retry redrives exactly its jobs', async () => {
  const page = await openPage(browser, dash.url, { hash: '#/failed' });
  const group = page.getByRole('article').filter({ has: page.getByRole('heading', { name: /^1 job\s+invalid signature$/ }) });
  await group.getByRole('button', { name: 'Retry this job' }).click();
  await page.getByRole('dialog', { name: 'Retry 1 job?' }).getByRole('button', { name: 'Confirm' }).click();
  await page.getByRole('status').filter({ hasText: 'Retried 1 job.' }).waitFor();
  assert.equal((await client.admin.getJob({ jobId: dead.other })).state, 'JOB_STATE_READY');
  assert.equal((await client.admin.getJob({ jobId: dead.beta })).state, 'JOB_STATE_FAILED');
  await group.waitFor({ state: 'detached' });
  assert.deepEqual(page.problems, []);
});
