// The job page: reaching a dead job from the overview, its error and attempt history, the
// payload renderings, the links up and down its dependencies, and the Retry, Cancel and Delete
// actions checked through gRPC.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, openPage, screenshot } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { connect, deadJob, enqueue, leaseJob } from './grpc.mjs';

let dash;
let client;
let browser;
let deadId;
const ERROR = 'SMTP 550 5.1.1 <nobody@example.com>: mailbox unavailable';

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  // The dead job first: leasing it must not pick up one of the ready jobs.
  deadId = await deadJob(client, 'emails', ERROR, {
    payload: JSON.stringify({ to: 'nobody@example.com', template: 'welcome' }),
    workerId: 'worker-7',
  });
  for (let i = 0; i < 3; i++) await enqueue(client, 'emails', JSON.stringify({ n: i }));
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

const state = async (id) => (await client.admin.getJob({ jobId: id })).state;

test('a dead job is reached from the overview, shows its error, and Retry makes it ready', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('link', { name: 'Ready jobs in emails: 3', exact: true }).waitFor();
  await page.getByRole('link', { name: 'Failed jobs in emails: 1', exact: true }).click();

  // The queue page, on its Failed tab, lists the one dead job.
  await page.getByRole('heading', { level: 1, name: 'Queue emails' }).waitFor();
  await page.getByRole('link', { name: 'Failed 1' }).waitFor();
  const table = page.getByRole('region', { name: 'Failed jobs, newest first', exact: true });
  await table.getByRole('link', { name: deadId }).click();

  await page.getByRole('heading', { level: 1, name: new RegExp(deadId) }).waitFor();
  const lastError = page.getByRole('region', { name: 'Last error' });
  assert.equal((await lastError.locator('pre').textContent()).trim(), ERROR);
  const details = page.getByRole('region', { name: 'Details' });
  assert.match(await details.textContent(), /Fail reason\s*Permanent/);
  const attempts = page.getByRole('region', { name: 'Attempts', exact: true }).getByRole('row');
  assert.equal(await attempts.count(), 2, 'a header row and one attempt');
  const attempt = await attempts.nth(1).textContent();
  assert.match(attempt, /worker-7/);
  assert.match(attempt, /Permanent error/);
  assert.match(attempt, /mailbox unavailable/);
  // A dead job can be retried or deleted, not cancelled.
  assert.equal(await page.getByRole('button', { name: 'Cancel job' }).count(), 0);
  await screenshot(page, 'job');

  await page.getByRole('button', { name: 'Retry job' }).click();
  const dialog = page.getByRole('dialog', { name: 'Retry this job?' });
  await dialog.waitFor();
  await dialog.getByRole('button', { name: 'Confirm' }).click();
  await page.getByRole('status').filter({ hasText: `Job ${deadId} is ready to run again.` }).waitFor();
  assert.equal(await state(deadId), 'JOB_STATE_READY');
  // The page shows the job's new state.
  await page.getByRole('heading', { level: 1, name: /Ready/ }).waitFor();
  assert.deepEqual(page.problems, []);
});

test('payloads: JSON pretty-printed, UTF-8 text as is, anything else as a hex dump', async () => {
  const json = { user: { id: 42, name: 'Zoë' }, tags: ['a', 'b'] };
  const jsonId = await enqueue(client, 'payloads', JSON.stringify(json));
  const textId = await enqueue(client, 'payloads', 'plain text, not JSON: <b>bold</b>');
  const binId = await enqueue(client, 'payloads', Buffer.from([0x00, 0x01, 0x02, 0xff, 0xfe, 0x41, 0x42]));

  const page = await openPage(browser, dash.url, { hash: `#/jobs/${jsonId}` });
  const payload = page.getByRole('region', { name: 'Payload' });
  await payload.locator('pre').waitFor();
  assert.equal(await payload.locator('pre').textContent(), JSON.stringify(json, null, 2));
  assert.match(await payload.textContent(), /JSON · \d+ B/);

  await page.goto(`${dash.url}/#/jobs/${textId}`);
  await payload.getByText('Text ·').waitFor();
  // Markup in a payload is shown as text, never interpreted.
  assert.equal(await payload.locator('pre').textContent(), 'plain text, not JSON: <b>bold</b>');
  assert.equal(await payload.locator('b').count(), 0);

  await page.goto(`${dash.url}/#/jobs/${binId}`);
  await payload.getByText('Binary, shown as hex · 7 B').waitFor();
  assert.match(await payload.locator('pre').textContent(), /^00000000 {2}00 01 02 ff fe 41 42 .*\|\.\.\.\.\.AB\|$/);
  assert.deepEqual(page.problems, []);
});

test('Cancel is refused by Escape, then confirmed from the keyboard; Delete removes the job', async () => {
  const id = await enqueue(client, 'cancels', '{}');
  const page = await openPage(browser, dash.url, { hash: `#/jobs/${id}` });
  const cancel = page.getByRole('button', { name: 'Cancel job' });
  await cancel.click();
  const dialog = page.getByRole('dialog', { name: 'Cancel this job?' });
  await dialog.waitFor();
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'hidden' });
  assert.equal(await state(id), 'JOB_STATE_READY', 'Escape cancels nothing');

  // A destructive action starts on the dialog's Cancel button; Shift+Tab reaches Confirm.
  await cancel.click();
  await dialog.waitFor();
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Cancel');
  await page.keyboard.press('Shift+Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Confirm');
  await page.keyboard.press('Enter');
  await page.getByRole('status').filter({ hasText: `Job ${id} cancelled.` }).waitFor();
  assert.equal(await state(id), 'JOB_STATE_CANCELLED');

  await page.getByRole('button', { name: 'Delete job' }).click();
  await page.getByRole('dialog', { name: 'Delete this job?' }).getByRole('button', { name: 'Confirm' }).click();
  // Back on the queue's page, with the outcome announced.
  await page.getByRole('heading', { level: 1, name: 'Queue cancels' }).waitFor();
  await page.getByRole('status').filter({ hasText: `Job ${id} deleted.` }).waitFor();
  await assert.rejects(client.admin.getJob({ jobId: id }), (err) => err.code === 5 /* NOT_FOUND */);
  assert.deepEqual(page.problems, []);
});

test('an unknown job shows the broker’s message', async () => {
  const missing = '01ARZ3NDEKTSV4RRFFQ69G5FAV';
  const page = await openPage(browser, dash.url, { hash: `#/jobs/${missing}` });
  const alert = page.getByRole('alert');
  await alert.waitFor();
  assert.match(await alert.textContent(), new RegExp(`${missing}.*not found|not found.*${missing}`, 'i'));
  // The failed request is the only console error.
  assert.ok(page.problems.every((p) => /404/.test(p)), page.problems.join('\n'));
});

test('a running job shows its run-time limit, expiry, snoozes and a progress bar', async () => {
  const farFuture = { seconds: 4102444800, nanos: 0 }; // 2100-01-01
  const id = await enqueue(client, 'reports', '{}', { timeout: { seconds: 600, nanos: 0 }, expireAt: farFuture });
  const first = await leaseJob(client, 'reports', id, 'worker-r');
  await client.broker.release({ jobId: id, leaseId: first.leaseId, delay: { seconds: 0, nanos: 1_000_000 } });
  await new Promise((resolve) => setTimeout(resolve, 50));
  let leased;
  for (let i = 0; i < 100 && !leased; i++) {
    const { jobs } = await client.broker.lease({ queue: 'reports', workerId: 'worker-r', maxJobs: 1 });
    leased = jobs[0];
    if (!leased) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.ok(leased, 'the snoozed job came back');
  await client.broker.heartbeat({ jobId: id, leaseId: leased.leaseId, progress: Buffer.from('{"percent": 40, "step": "render"}') });

  const page = await openPage(browser, dash.url, { hash: `#/jobs/${id}` });
  await page.getByRole('heading', { level: 1, name: new RegExp(id) }).waitFor();
  const details = page.getByRole('region', { name: 'Details' });
  const text = await details.textContent();
  assert.match(text, /Run-time limit\s*10 min/);
  assert.match(text, /Times out/);
  assert.match(text, /Expires/);
  assert.match(text, /Snoozes\s*1/);
  const bar = details.getByRole('progressbar', { name: 'Progress 40%' });
  assert.equal(await bar.getAttribute('value'), '40');
  assert.match(text, /"step": "render"|"step":"render"/);
  const attempts = page.getByRole('region', { name: 'Attempts', exact: true }).getByRole('row');
  assert.match(await attempts.nth(1).textContent(), /Snoozed/);
  await screenshot(page, 'job-progress');
});

test('a waiting job links to the jobs it waits for and shows their results once they completed', async () => {
  const first = await enqueue(client, 'thumbs', 'a');
  const second = await enqueue(client, 'thumbs', 'b');
  const join = await enqueue(client, 'thumbs', 'join', { dependsOn: [first, second] });
  assert.equal(await state(join), 'JOB_STATE_WAITING');

  const page = await openPage(browser, dash.url, { hash: `#/jobs/${join}` });
  await page.getByRole('heading', { level: 1, name: new RegExp(join) }).waitFor();
  const details = page.getByRole('region', { name: 'Details' });
  assert.match(await details.textContent(), /State\s*Waiting/);
  await details.getByRole('link', { name: first }).waitFor();

  for (const id of [first, second]) {
    const leased = await leaseJob(client, 'thumbs', id, 'worker-t');
    await client.broker.ack({ jobId: id, leaseId: leased.leaseId, result: Buffer.from(`done ${id.slice(-4)}`) });
  }
  await page.reload();
  await page.getByRole('heading', { level: 1, name: new RegExp(join) }).waitFor();
  const text = await page.getByRole('region', { name: 'Details' }).textContent();
  assert.match(text, /State\s*Ready/);
  assert.match(text, new RegExp(`result: done ${second.slice(-4)}`));
  await page.getByRole('region', { name: 'Details' }).getByRole('link', { name: second }).click();
  await page.getByRole('heading', { level: 1, name: new RegExp(second) }).waitFor();
  assert.deepEqual(page.problems, []);
});

// The "Needed by" entry of a job page's details: the jobs that wait for it.
const neededBy = (page) =>
  page
    .getByRole('region', { name: 'Details' })
    .locator('div')
    .filter({ has: page.locator('dt', { hasText: /^Needed by$/ }) })
    .locator('dd');

test('a job links to the jobs that wait for it, with their states, and each links back to it', async () => {
  const root = await enqueue(client, 'pipeline', 'root');
  const first = await enqueue(client, 'pipeline', 'first', { dependsOn: [root] });
  const second = await enqueue(client, 'pipeline', 'second', { dependsOn: [root] });

  const page = await openPage(browser, dash.url, { hash: `#/jobs/${root}` });
  await page.getByRole('heading', { level: 1, name: new RegExp(root) }).waitFor();
  const below = neededBy(page);
  await below.getByRole('link').nth(1).waitFor();
  assert.deepEqual(await below.getByRole('link').allTextContents(), [first, second].sort());
  // Each with its state, once its own request answered.
  await below.getByText('Waiting', { exact: true }).nth(1).waitFor();
  assert.equal(await below.getByText('Waiting', { exact: true }).count(), 2);
  assert.doesNotMatch(await page.getByRole('region', { name: 'Details' }).textContent(), /Waits for/);

  await below.getByRole('link', { name: second }).click();
  await page.getByRole('heading', { level: 1, name: new RegExp(second) }).waitFor();
  const details = page.getByRole('region', { name: 'Details' });
  assert.match(await details.textContent(), /Waits for/);
  assert.doesNotMatch(await details.textContent(), /Needed by/);
  await details.getByRole('link', { name: root }).click();
  await page.getByRole('heading', { level: 1, name: new RegExp(root) }).waitFor();
  await neededBy(page).getByRole('link', { name: first }).waitFor();
  assert.deepEqual(page.problems, []);
});

test('a waiting job can be cancelled, and cancelling a job says its dependents will fail', async () => {
  const root = await enqueue(client, 'chain', 'root');
  const waiting = await enqueue(client, 'chain', 'next', { dependsOn: [root] });
  const page = await openPage(browser, dash.url, { hash: `#/jobs/${root}` });
  await neededBy(page).getByRole('link', { name: waiting }).waitFor();
  await page.getByRole('button', { name: 'Cancel job' }).click();
  const dialog = page.getByRole('dialog', { name: 'Cancel this job?' });
  await dialog.getByText(`Job ${root} will not run. It can be retried later. The job that waits for it will fail.`).waitFor();
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'hidden' });

  await page.goto(`${dash.url}#/jobs/${waiting}`);
  await page.getByRole('heading', { level: 1, name: new RegExp(waiting) }).waitFor();
  await page.getByRole('button', { name: 'Cancel job' }).click();
  await dialog.getByRole('button', { name: 'Confirm' }).click();
  await page.getByRole('status').filter({ hasText: `Job ${waiting} cancelled.` }).waitFor();
  assert.equal(await state(waiting), 'JOB_STATE_CANCELLED');
  assert.equal(await state(root), 'JOB_STATE_READY', 'a dependency is not touched');
  assert.deepEqual(page.problems, []);
});

test('a job that many wait for lists the first 20, looks only those up, and counts the rest', async () => {
  const root = await enqueue(client, 'fanout', 'root');
  const { results } = await client.broker.enqueueBatch({
    jobs: Array.from({ length: 23 }, (_, i) => ({ queue: 'fanout', payload: Buffer.from(String(i)), dependsOn: [root] })),
  });
  const waiting = results.map((r) => r.jobId).sort();

  const jobRequests = [];
  const page = await openPage(browser, dash.url, {
    hash: `#/jobs/${root}`,
    beforeLoad: (p) => p.on('request', (r) => r.url().includes('/api/v1/jobs/') && jobRequests.push(r.url())),
  });
  await page.getByRole('heading', { level: 1, name: new RegExp(root) }).waitFor();
  const below = neededBy(page);
  await below.getByText('and 3 more', { exact: true }).waitFor();
  assert.deepEqual(await below.getByRole('link').allTextContents(), waiting.slice(0, 20));
  await below.getByText('Waiting', { exact: true }).nth(19).waitFor();
  assert.equal(await below.getByText('Waiting', { exact: true }).count(), 20);
  assert.equal(jobRequests.length, 21, 'the job and the 20 it lists, not the 3 it only counts');
  assert.deepEqual(page.problems, []);
});
