// The schedules page (#/schedules): each schedule with its timing, status and next run; "Run now"
// enqueues a job linked from the row, "Pause" and "Resume" flip it, "Delete" asks first. Checked
// against what the broker holds, through gRPC.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, openPage, screenshot } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { connect } from './grpc.mjs';

let dash;
let client;
let browser;

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  await client.admin.putSchedule({
    schedule: { scheduleId: 'nightly-report', cron: '30 2 * * *', timeZone: 'Europe/Berlin', template: { queue: 'reports', payload: Buffer.from('{}') } },
  });
  await client.admin.putSchedule({ schedule: { scheduleId: 'digest', every: { seconds: 900 }, template: { queue: 'mail' } } });
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

test('lists the schedules, runs one now, pauses and resumes it, and deletes one after asking', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Schedules' }).click();
  await page.getByRole('heading', { level: 1, name: 'Schedules' }).waitFor();
  await page.getByText('2 schedules').waitFor();
  assert.equal(await page.getByRole('link', { name: 'Schedules' }).getAttribute('aria-current'), 'page');

  const table = page.getByRole('region', { name: 'Schedules table' });
  const nightly = table.locator('tr[data-schedule="nightly-report"]');
  assert.match(await nightly.textContent(), /nightly-report\s*30 2 \* \* \* \(Europe\/Berlin\)\s*reports\s*Active/);
  const digest = table.locator('tr[data-schedule="digest"]');
  assert.match(await digest.textContent(), /every 15 min\s*mail\s*Active/);
  await screenshot(page, 'schedules');

  // Run now: a job is enqueued, announced, and linked as the last run.
  await nightly.getByRole('button', { name: 'Run now nightly-report' }).click();
  await page.getByText(/Schedule nightly-report enqueued job [0-9A-Z]{26}/).waitFor();
  const stored = await client.admin.getSchedule({ scheduleId: 'nightly-report' });
  assert.match(stored.lastJobId, /^[0-9A-Z]{26}$/);
  await nightly.getByRole('link', { name: stored.lastJobId }).waitFor();
  const job = await client.admin.getJob({ jobId: stored.lastJobId });
  assert.equal(job.queue, 'reports');

  // Pause, then resume.
  await digest.getByRole('button', { name: 'Pause digest' }).click();
  await digest.getByText('Paused', { exact: true }).waitFor();
  assert.equal((await client.admin.getSchedule({ scheduleId: 'digest' })).paused, true);
  await page.getByText('2 schedules, 1 paused').waitFor();
  await digest.getByRole('button', { name: 'Resume digest' }).click();
  await digest.getByText('Active', { exact: true }).waitFor();
  assert.equal((await client.admin.getSchedule({ scheduleId: 'digest' })).paused, false);

  // Delete asks first; cancelling keeps it.
  await digest.getByRole('button', { name: 'Delete digest' }).click();
  const dialog = page.getByRole('dialog', { name: 'Delete schedule digest?' });
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  assert.equal((await client.admin.listSchedules({})).schedules.length, 2);
  await digest.getByRole('button', { name: 'Delete digest' }).click();
  await dialog.getByRole('button', { name: 'Delete' }).click();
  await page.getByText('1 schedule', { exact: true }).waitFor();
  assert.deepEqual(
    (await client.admin.listSchedules({})).schedules.map((s) => s.scheduleId),
    ['nightly-report'],
  );
  assert.deepEqual(page.problems, []);
});
