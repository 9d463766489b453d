// The queue overview: its columns, counts by state (Waiting too), live rates and chart, Pause/Resume checked through gRPC,
// and the same page at phone width and in dark mode.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { eventually, launch, openPage, screenshot } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { completedJobs, connect, deadJob, enqueue, leaseJob } from './grpc.mjs';

let dash;
let client;
let browser;
let waitingId;

before(async () => {
  dash = await startDashboard();
  client = connect(dash.grpc);
  browser = await launch();
  // emails: 1 dead and 3 ready, the counts the first test asserts.
  await deadJob(client, 'emails', 'SMTP 550: mailbox unavailable');
  for (let i = 0; i < 3; i++) await enqueue(client, 'emails', JSON.stringify({ to: `user${i}@example.com` }));
  // billing.invoices: a concurrency limit, two active, one scheduled, some completed.
  await client.admin.updateQueuePolicy({ queue: 'billing.invoices', policy: { maxConcurrency: 8 } });
  await completedJobs(client, 'billing.invoices', 4);
  for (let i = 0; i < 2; i++) {
    const id = await enqueue(client, 'billing.invoices', JSON.stringify({ invoice: i }));
    await leaseJob(client, 'billing.invoices', id, 'billing-worker-1');
  }
  await enqueue(client, 'billing.invoices', '{}', { delay: { seconds: 3600 } });
  // webhooks: paused with work waiting.
  for (let i = 0; i < 4; i++) await enqueue(client, 'webhooks', '{}');
  await client.admin.pauseQueue({ queue: 'webhooks' });
  // reports: one ready job and one waiting for it.
  const first = await enqueue(client, 'reports', '{}');
  waitingId = await enqueue(client, 'reports', '{}', { dependsOn: [first] });
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

const paused = async (queue) => (await client.admin.getQueue({ queue })).policy.paused;

// Traffic on the thumbnails queue until stop() (at most 80 rounds of ~0.3 s): each round
// enqueues three jobs and completes the two oldest ready ones, so a backlog builds slowly.
function startTraffic() {
  let stopped = false;
  const done = (async () => {
    for (let r = 0; r < 80 && !stopped; r++) {
      for (let i = 0; i < 3; i++) await enqueue(client, 'thumbnails', JSON.stringify({ image: r * 3 + i }));
      const { jobs } = await client.broker.lease({ queue: 'thumbnails', workerId: 'thumbnailer-1', maxJobs: 2 });
      for (const j of jobs) await client.broker.ack({ jobId: j.jobId, leaseId: j.leaseId });
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  })();
  return async () => {
    stopped = true;
    await done;
  };
}

test('the overview shows every queue with its counts by state', async () => {
  const page = await openPage(browser, dash.url);
  const link = (name) => page.getByRole('link', { name, exact: true });
  await link('Ready jobs in emails: 3').waitFor();
  await link('Failed jobs in emails: 1').waitFor();
  await link('Scheduled jobs in emails: 0').waitFor();
  await link('Active jobs in billing.invoices: 2 of at most 8').waitFor();
  await link('Completed jobs in billing.invoices: 4').waitFor();
  await link('Scheduled jobs in billing.invoices: 1').waitFor();
  await link('Active jobs in emails: 0, no limit').waitFor();
  // A paused queue says so in words, next to its name.
  const webhooks = page.getByRole('row').filter({ has: page.getByRole('link', { name: 'webhooks', exact: true }) });
  await webhooks.getByText('Paused', { exact: true }).waitFor();
  await webhooks.getByRole('button', { name: 'Resume queue webhooks' }).waitFor();
  const emails = page.getByRole('row').filter({ has: page.getByRole('link', { name: 'emails', exact: true }) });
  assert.equal(await emails.getByText('Paused', { exact: true }).isVisible(), false);
  // Its oldest ready job has an age (not "—").
  assert.match(await emails.textContent(), /\d+(\.\d)? (ms|s|min)\b/);
  // The count links lead to the queue's list in that state.
  await link('Ready jobs in emails: 3').click();
  await page.getByRole('heading', { level: 1, name: 'Queue emails' }).waitFor();
  assert.match(page.url(), /#\/queues\/emails\?state=JOB_STATE_READY$/);
  const list = page.getByRole('region', { name: 'Ready jobs, newest first', exact: true });
  // The region is drawn before its rows arrive: wait for the last one, then count them all.
  await list.getByRole('row').nth(3).waitFor();
  assert.equal(await list.getByRole('row').count(), 4, 'a header row and three jobs');
  assert.deepEqual(page.problems, []);
});

test('a job waiting for another is counted under Waiting and listed by the queue’s Waiting tab', async () => {
  const page = await openPage(browser, dash.url);
  const link = (name) => page.getByRole('link', { name, exact: true });
  await link('Waiting jobs in reports: 1').waitFor();
  // The states in the order a job moves through them, Waiting first.
  const headers = page.getByRole('region', { name: 'Queues table' }).getByRole('columnheader');
  assert.deepEqual(await headers.allTextContents(), [
    'Queue',
    'Waiting',
    'Ready',
    'Scheduled',
    'Active / limit',
    'Completed',
    'Failed',
    'Cancelled',
    'Oldest ready',
    'Jobs per second',
    'Actions',
  ]);
  const reports = page.getByRole('row').filter({ has: link('reports') });
  assert.equal(await reports.locator('th, td').count(), 11, 'one cell under each column');
  await link('Ready jobs in reports: 1').waitFor();
  await link('Waiting jobs in emails: 0').waitFor();

  await link('Waiting jobs in reports: 1').click();
  await page.getByRole('heading', { level: 1, name: 'Queue reports' }).waitFor();
  assert.match(page.url(), /#\/queues\/reports\?state=JOB_STATE_WAITING$/);
  const tabs = page.getByRole('navigation', { name: 'Job states' });
  await tabs.getByRole('link', { name: 'Waiting 1' }).waitFor();
  assert.deepEqual(await tabs.getByRole('link').allTextContents(), [
    'All',
    'Waiting 1',
    'Ready 1',
    'Scheduled 0',
    'Active 0',
    'Completed 0',
    'Failed 0',
    'Cancelled 0',
  ]);
  assert.equal(await tabs.getByRole('link', { name: 'Waiting 1' }).getAttribute('aria-current'), 'page');
  const rows = page.getByRole('region', { name: 'Waiting jobs, newest first', exact: true }).locator('tbody tr');
  await rows.first().waitFor();
  assert.equal(await rows.count(), 1);
  assert.equal((await rows.first().getByRole('link').textContent()).trim(), waitingId);
  await rows.first().getByText('Waiting', { exact: true }).waitFor();
  assert.deepEqual(page.problems, []);
});

test('rates and the chart follow live traffic', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('link', { name: 'Ready jobs in emails: 3', exact: true }).waitFor();
  const stopTraffic = startTraffic();
  try {
    await checkRates(page);
  } finally {
    await stopTraffic();
  }
  assert.deepEqual(page.problems, []);
});

async function checkRates(page) {
  const thumbnails = page.getByRole('row').filter({ has: page.getByRole('link', { name: 'thumbnails', exact: true }) });
  // Three enqueued and two completed every ~0.3 s, sampled every 2 s: clearly above zero.
  await eventually('a non-zero enqueue rate for thumbnails', async () => {
    const text = await thumbnails.textContent();
    const m = /([\d.]+)\/s in\s*([\d.]+)\/s done/.exec(text);
    return m && Number(m[1]) > 0 && Number(m[2]) > 0;
  });
  const chart = page.getByRole('img', { name: /Jobs per second over the last/ });
  await chart.waitFor();
  assert.ok((await chart.locator('path.line-enqueue').count()) === 1, 'the enqueue line is drawn');
  assert.ok((await chart.locator('path.line-complete').count()) === 1, 'the complete line is drawn');
  await page.getByText(/Enqueued [1-9][\d.]*\/s/).waitFor();
  // About 10 s of samples (one every 2 s) joined into one line, then the picture for the docs.
  await eventually('five joined points on the enqueue line', async () => {
    const d = await chart.locator('path.line-enqueue').getAttribute('d');
    return (d.match(/L/g) ?? []).length >= 4;
  }, 30_000);
  await screenshot(page, 'overview');
}

test('Pause and Resume change the queue’s policy', async () => {
  const page = await openPage(browser, dash.url);
  await page.getByRole('button', { name: 'Pause queue emails' }).click();
  await page.getByRole('status').filter({ hasText: 'Queue emails paused.' }).waitFor();
  assert.equal(await paused('emails'), true);
  const emails = page.getByRole('row').filter({ has: page.getByRole('link', { name: 'emails', exact: true }) });
  await emails.getByText('Paused', { exact: true }).waitFor();

  await page.getByRole('button', { name: 'Resume queue emails' }).click();
  await page.getByRole('status').filter({ hasText: 'Queue emails resumed.' }).waitFor();
  assert.equal(await paused('emails'), false);
  await emails.getByText('Paused', { exact: true }).waitFor({ state: 'hidden' });
  await page.getByRole('button', { name: 'Pause queue emails' }).waitFor();
  assert.deepEqual(page.problems, []);
});

// Makes the page believe its tab was hidden or shown again.
function setHidden(page, hidden) {
  return page.evaluate((value) => {
    Object.defineProperty(document, 'hidden', { configurable: true, get: () => value });
    Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => (value ? 'hidden' : 'visible') });
    document.dispatchEvent(new Event('visibilitychange'));
  }, hidden);
}

test('polling stops while the tab is hidden and starts again when it is shown', async () => {
  // The page's timers run only when the test advances them, and the page counts its own polls
  // as it sends them, so the count is exact the moment runFor returns.
  const page = await openPage(browser, dash.url, {
    beforeLoad: async (p) => {
      await p.clock.install();
      await p.addInitScript(() => {
        const send = window.fetch;
        window.queuePolls = 0;
        window.queueAnswers = 0;
        window.fetch = (input, init) => {
          if (String(input) !== '/api/v1/queues') return send(input, init);
          window.queuePolls += 1;
          // Counted once the page has read the body: the rest of its poll runs in microtasks,
          // which end before the test's next evaluate.
          return send(input, init).then((response) => {
            const text = response.text.bind(response);
            response.text = () =>
              text().finally(() => {
                window.queueAnswers += 1;
              });
            return response;
          });
        };
      });
    },
  });
  const polls = () => page.evaluate(() => window.queuePolls);
  const answers = () => page.evaluate(() => window.queueAnswers);
  const live = page.getByTitle('Refreshed every 2 seconds while this tab is visible');
  // The first poll has been answered; the next is due in 2 s of the page's time.
  await page.getByRole('link', { name: 'Ready jobs in emails: 3', exact: true }).waitFor();
  assert.equal(await polls(), 1);
  await page.clock.runFor(2100);
  assert.equal(await polls(), 2);
  // Answered, not only "Live" (the first poll set that already): a poll still in flight when
  // the tab is shown again would be the one the page waits for, and no new one would start.
  await eventually('that poll answered', async () => (await answers()) === 2);

  await setHidden(page, true);
  assert.equal(await live.textContent(), 'Paused');
  await page.clock.runFor(60_000);
  assert.equal(await polls(), 2, 'no poll while hidden');

  await setHidden(page, false);
  assert.equal(await polls(), 3, 'a poll as soon as the tab is shown');
  await eventually('live again', async () => (await live.textContent()) === 'Live');
  await page.clock.runFor(2100);
  assert.equal(await polls(), 4, 'and every 2 s after');
  assert.deepEqual(page.problems, []);
});

test('at phone width the page does not scroll sideways', async () => {
  const page = await openPage(browser, dash.url, { viewport: { width: 390, height: 844 } });
  await page.getByRole('link', { name: 'Ready jobs in emails: 3', exact: true }).waitFor({ state: 'attached' });
  await page.getByRole('img', { name: /Jobs per second/ }).waitFor();
  const widths = await page.evaluate(() => ({
    page: document.documentElement.scrollWidth,
    body: document.body.scrollWidth,
    viewport: document.documentElement.clientWidth,
  }));
  assert.ok(widths.page <= widths.viewport && widths.body <= widths.viewport, JSON.stringify(widths));
  // The wide table scrolls inside its own box, which the keyboard can reach.
  const scroller = page.getByRole('region', { name: 'Queues table' });
  assert.equal(await scroller.getAttribute('tabindex'), '0');
  const box = await scroller.boundingBox();
  assert.ok(box.x >= 0 && box.x + box.width <= widths.viewport, JSON.stringify(box));
  await screenshot(page, 'phone', { fullPage: true });
  assert.deepEqual(page.problems, []);
});

// WCAG contrast of an element's text against the first opaque background behind it.
function contrastOf(page, locator) {
  return locator.evaluate((el) => {
    const rgb = (s) => s.match(/[\d.]+/g).map(Number);
    const lum = ([r, g, b]) => {
      const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    let bg = el;
    while (bg && (getComputedStyle(bg).backgroundColor === 'rgba(0, 0, 0, 0)' || rgb(getComputedStyle(bg).backgroundColor)[3] === 0)) {
      bg = bg.parentElement;
    }
    const back = lum(rgb(bg ? getComputedStyle(bg).backgroundColor : 'rgb(255,255,255)'));
    const fore = lum(rgb(getComputedStyle(el).color));
    return { ratio: (Math.max(back, fore) + 0.05) / (Math.min(back, fore) + 0.05), back };
  });
}

for (const scheme of ['light', 'dark']) {
  test(`${scheme} mode renders with readable contrast`, async () => {
    const page = await openPage(browser, dash.url, { colorScheme: scheme });
    await page.getByRole('link', { name: 'Ready jobs in emails: 3', exact: true }).waitFor();
    const samples = {
      heading: page.getByRole('heading', { level: 1, name: 'Queues' }),
      totals: page.getByText(/\d+ queues ·/),
      'queue link': page.getByRole('link', { name: 'emails', exact: true }),
      'column header': page.getByRole('columnheader', { name: 'Ready', exact: true }),
      'failed count': page.getByRole('link', { name: 'Failed jobs in emails: 1', exact: true }),
      'zero count': page.getByRole('link', { name: 'Cancelled jobs in emails: 0', exact: true }),
      'paused badge': page.getByText('Paused', { exact: true }).filter({ visible: true }).first(),
      'pause button': page.getByRole('button', { name: 'Pause queue emails' }),
      nav: page.getByRole('link', { name: 'Failed jobs', exact: true }),
    };
    for (const [what, locator] of Object.entries(samples)) {
      const { ratio, back } = await contrastOf(page, locator);
      assert.ok(ratio >= 4.5, `${scheme}: ${what} has contrast ${ratio.toFixed(2)}`);
      if (what === 'heading') {
        if (scheme === 'dark') assert.ok(back < 0.05, `dark background (luminance ${back})`);
        else assert.ok(back > 0.8, `light background (luminance ${back})`);
      }
    }
    if (scheme === 'dark') await screenshot(page, 'dark');
    assert.deepEqual(page.problems, []);
  });
}
