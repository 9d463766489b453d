// Every view, and the confirmation dialog, in light and dark mode, audited by axe-core for the
// WCAG 2.1 A and AA rules and axe's best practices (landmarks, names, contrast, headings...).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import { launch, openPage } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { completedJobs, connect, deadJob, enqueue, leaseJob } from './grpc.mjs';

const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

let dash;
let client;
let browser;
let deadId;
let rootId;

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  deadId = await deadJob(client, 'emails', 'SMTP 550: mailbox unavailable', { payload: '{"to":"a@example.com"}' });
  await completedJobs(client, 'emails', 2);
  await enqueue(client, 'emails', '{}', { dedupKey: 'welcome-1', headers: { 'trace-id': 'abc' } });
  await enqueue(client, 'webhooks', Buffer.from([0, 1, 2, 255]));
  // A job of emails waiting for one of webhooks: a Waiting badge in the queue view, and a job
  // page with the jobs that wait for it.
  rootId = await enqueue(client, 'webhooks', '{}');
  await enqueue(client, 'emails', '{}', { dependsOn: [rootId] });
  await client.admin.pauseQueue({ queue: 'webhooks' });
  // A worker running a job that reports progress, for the workers view.
  const renderId = await enqueue(client, 'renders', '{}');
  const leased = await leaseJob(client, 'renders', renderId, 'gpu-1');
  await client.broker.heartbeat({ jobId: renderId, leaseId: leased.leaseId, progress: Buffer.from('{"percent": 60}') });
  // A schedule for the schedules view, one paused.
  await client.admin.putSchedule({ schedule: { scheduleId: 'nightly', cron: '30 2 * * *', timeZone: 'Europe/Berlin', template: { queue: 'reports' } } });
  await client.admin.putSchedule({ schedule: { scheduleId: 'hourly', every: { seconds: 3600 }, paused: true, template: { queue: 'reports' } } });
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

// The violations axe finds on the page as it is now, one line each.
async function audit(page) {
  // Evaluated through the devtools protocol: the page's CSP rightly refuses an injected <script>.
  await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document, {
      runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] },
    });
    return result.violations.map((v) => `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
  });
  return violations;
}

const views = [
  ['overview', '#/', (page) => page.getByRole('link', { name: 'Ready jobs in emails: 1', exact: true })],
  ['queue', '#/queues/emails', (page) => page.getByRole('region', { name: 'All jobs, newest first', exact: true }).locator('tbody tr').first()],
  ['job', () => `#/jobs/${deadId}`, (page) => page.getByRole('region', { name: 'Attempts', exact: true })],
  ['job with dependents', () => `#/jobs/${rootId}`, (page) => page.getByRole('region', { name: 'Details' }).getByText('Waiting', { exact: true })],
  ['failed', '#/failed', (page) => page.getByRole('article').first()],
  ['workers', '#/workers', (page) => page.getByRole('region', { name: 'Workers table', exact: true }).locator('tbody tr').first()],
  ['schedules', '#/schedules', (page) => page.getByRole('region', { name: 'Schedules table', exact: true }).locator('tbody tr').first()],
  ['cluster', '#/cluster', (page) => page.getByRole('region', { name: 'Partitions table', exact: true }).locator('tbody tr').first()],
];

for (const scheme of ['light', 'dark']) {
  for (const [name, hash, ready] of views) {
    test(`${name} view, ${scheme}: no accessibility violations`, async () => {
      const page = await openPage(browser, dash.url, { colorScheme: scheme, hash: typeof hash === 'function' ? hash() : hash });
      await ready(page).waitFor();
      assert.deepEqual(await audit(page), []);
      assert.deepEqual(page.problems, []);
    });
  }

  test(`confirmation dialog, ${scheme}: no accessibility violations`, async () => {
    const page = await openPage(browser, dash.url, { colorScheme: scheme, hash: '#/queues/emails' });
    await page.getByRole('button', { name: 'Purge finished jobs of queue emails' }).click();
    await page.getByRole('dialog', { name: 'Purge queue emails?' }).waitFor();
    assert.deepEqual(await audit(page), []);
    await page.keyboard.press('Escape');
  });
}
