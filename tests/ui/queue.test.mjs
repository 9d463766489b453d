// A queue's page: tabs by state, newest-first pages, the search by job id or dedup key, and the
// purge of finished jobs checked through gRPC.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, openPage } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { completedJobs, connect, deadJob, enqueue } from './grpc.mjs';

let dash;
let client;
let browser;
const ids = []; // the ready jobs of "bulk", oldest first

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  await deadJob(client, 'bulk', 'timeout after 30s');
  await completedJobs(client, 'bulk', 2);
  // 60 ready jobs: a page of 50 and one of 10. Every tenth holds a dedup key.
  const jobs = [];
  for (let i = 0; i < 60; i++) {
    jobs.push({ queue: 'bulk', payload: Buffer.from(JSON.stringify({ i })), dedupKey: i % 10 === 0 ? `order-${i}` : '' });
  }
  const { results } = await client.broker.enqueueBatch({ jobs });
  ids.push(...results.map((r) => r.jobId));
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

const rowsOf = (page, name) => page.getByRole('region', { name, exact: true }).locator('tbody tr');

test('tabs filter by state and pages go forward and back, newest first', async () => {
  const page = await openPage(browser, dash.url, { hash: '#/queues/bulk' });
  await page.getByRole('heading', { level: 1, name: 'Queue bulk' }).waitFor();
  const tabs = page.getByRole('navigation', { name: 'Job states' });
  await tabs.getByRole('link', { name: 'Ready 60' }).waitFor();
  // One tab per state, in the order a job moves through them.
  assert.deepEqual(await tabs.getByRole('link').allTextContents(), [
    'All',
    'Waiting 0',
    'Ready 60',
    'Scheduled 0',
    'Active 0',
    'Completed 2',
    'Failed 1',
    'Cancelled 0',
  ]);
  await tabs.getByRole('link', { name: 'Ready 60' }).click();
  assert.equal(await tabs.getByRole('link', { name: 'Ready 60' }).getAttribute('aria-current'), 'page');

  const rows = rowsOf(page, 'Ready jobs, newest first');
  await rows.nth(49).waitFor();
  assert.equal(await rows.count(), 50);
  assert.equal((await rows.first().getByRole('link').textContent()).trim(), ids[59], 'the newest job first');
  await page.getByText('Page 1 · Jobs 1–50').waitFor();
  assert.equal(await page.getByRole('button', { name: 'Previous page' }).isDisabled(), true);

  await page.getByRole('button', { name: 'Next page' }).click();
  await page.getByText('Page 2 · Jobs 51–60').waitFor();
  assert.equal(await rows.count(), 10);
  assert.equal((await rows.last().getByRole('link').textContent()).trim(), ids[0], 'the oldest job last');
  assert.equal(await page.getByRole('button', { name: 'Next page' }).isDisabled(), true);

  await page.getByRole('button', { name: 'Previous page' }).click();
  await page.getByText('Page 1 · Jobs 1–50').waitFor();
  assert.equal(await rows.count(), 50);

  // Other tabs.
  await tabs.getByRole('link', { name: 'Completed 2' }).click();
  await rowsOf(page, 'Completed jobs, newest first').nth(1).waitFor();
  assert.equal(await rowsOf(page, 'Completed jobs, newest first').count(), 2);
  await tabs.getByRole('link', { name: 'Failed 1' }).click();
  const dead = rowsOf(page, 'Failed jobs, newest first');
  await dead.first().waitFor();
  assert.match(await dead.first().textContent(), /timeout after 30s/);
  await tabs.getByRole('link', { name: 'Cancelled 0' }).click();
  await page.getByText('No jobs here.').waitFor();
  assert.deepEqual(page.problems, []);
});

test('the search box opens a job by id and finds one by dedup key', async () => {
  const page = await openPage(browser, dash.url, { hash: '#/queues/bulk' });
  const search = page.getByRole('searchbox', { name: 'Job id or dedup key' });

  await search.fill(ids[7]);
  await search.press('Enter');
  await page.getByRole('heading', { level: 1, name: new RegExp(ids[7]) }).waitFor();

  await page.goto(`${dash.url}/#/queues/bulk`);
  await search.fill('order-30');
  await page.getByRole('button', { name: 'Search' }).click();
  const found = rowsOf(page, 'Job with dedup key “order-30”');
  await found.first().waitFor();
  assert.equal(await found.count(), 1);
  assert.equal((await found.first().getByRole('link').textContent()).trim(), ids[30]);

  await search.fill('order-31');
  await search.press('Enter');
  await page.getByText('No job of queue bulk holds the dedup key “order-31”.').waitFor();

  // A well-formed id that is no job is looked up as a dedup key instead.
  await search.fill('01ARZ3NDEKTSV4RRFFQ69G5FAV');
  await search.press('Enter');
  await page.getByText('No job of queue bulk holds the dedup key “01ARZ3NDEKTSV4RRFFQ69G5FAV”.').waitFor();
});

test('Purge removes the chosen finished jobs and keeps the rest', async () => {
  const page = await openPage(browser, dash.url, { hash: '#/queues/bulk' });
  await page.getByRole('button', { name: 'Purge finished jobs of queue bulk' }).click();
  const dialog = page.getByRole('dialog', { name: 'Purge queue bulk?' });
  await dialog.waitFor();
  // Keep the dead job: untick Failed.
  await dialog.getByRole('checkbox', { name: 'Failed' }).uncheck();
  await dialog.getByRole('button', { name: 'Confirm' }).click();
  await page.getByRole('status').filter({ hasText: 'Purged 2 jobs from queue bulk.' }).waitFor();
  const { counts } = await client.admin.getQueue({ queue: 'bulk' });
  assert.equal(counts.JOB_STATE_COMPLETED, '0');
  assert.equal(counts.JOB_STATE_FAILED, '1');
  assert.equal(counts.JOB_STATE_READY, '60');
  await page.getByRole('navigation', { name: 'Job states' }).getByRole('link', { name: 'Completed 0' }).waitFor();
  assert.deepEqual(page.problems, []);
});
