// "What is failing right now" (#/failed): the newest dead jobs of every queue, grouped by their
// last error, with a bulk retry per queue and per group.

import { h, replace } from './dom.js';
import { confirmAction } from './dialogs.js';
import { retryDeadButton, run } from './actions.js';
import { jobLink, timeCell } from './jobstable.js';
import { formatCount, num, parseTime } from './format.js';

// Dead jobs read per queue: enough to see the patterns, bounded so a queue with a million dead
// jobs does not stall the page.
const PER_QUEUE = 500;
const LINKS_PER_GROUP = 5;

export function render(root, ctx) {
  ctx.setTitle('Failed jobs');
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  root.append(
    h('h1', { tabindex: '-1' }, 'Failed jobs'),
    h(
      'p',
      { class: 'lead' },
      `Dead jobs: failed permanently or out of attempts. The newest ${PER_QUEUE} of each queue, grouped by their last error.`,
    ),
    h('div', { class: 'toolbar' }, h('button', { type: 'button', class: 'secondary', onclick: () => load() }, 'Refresh')),
    body,
  );
  let disposed = false;

  async function load() {
    body.setAttribute('aria-busy', 'true');
    try {
      const { queues = [] } = await ctx.api.listQueues();
      const dead = queues.filter((q) => num(q.dead) > 0);
      const lists = await mapLimited(dead, 4, (q) =>
        ctx.api.listJobs(q.name, { state: 'JOB_STATE_FAILED', pageSize: PER_QUEUE, newestFirst: true }),
      );
      if (disposed) return;
      const jobs = lists.flatMap((l) => l.jobs ?? []);
      replace(body, queueSection(ctx, dead, lists, load), groupSection(ctx, group(jobs), load));
    } catch (err) {
      if (!disposed) replace(body, h('p', { class: 'banner error', role: 'alert' }, err.message));
    } finally {
      body.removeAttribute('aria-busy');
    }
  }

  load();
  return {
    dispose() {
      disposed = true;
    },
  };
}

// fn over every item, at most `limit` calls at a time (many queues with dead jobs should not
// become hundreds of simultaneous requests); results in the items' order.
async function mapLimited(items, limit, fn) {
  const results = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

// Groups jobs by their exact last error; the largest group first, then the most recent.
function group(jobs) {
  const groups = new Map();
  for (const job of jobs) {
    const key = (job.lastError ?? '').trim();
    let g = groups.get(key);
    if (!g) groups.set(key, (g = { error: key, jobs: [], queues: new Map(), newest: null }));
    g.jobs.push(job);
    g.queues.set(job.queue, (g.queues.get(job.queue) ?? 0) + 1);
    const ended = parseTime(job.completedAt) ?? parseTime(job.createdAt);
    if (ended && (!g.newest || ended > g.newest)) g.newest = ended;
  }
  for (const g of groups.values()) {
    g.jobs.sort((a, b) => endedAt(b) - endedAt(a));
  }
  return [...groups.values()].sort((a, b) => b.jobs.length - a.jobs.length || (b.newest ?? 0) - (a.newest ?? 0));
}

function endedAt(job) {
  return (parseTime(job.completedAt) ?? parseTime(job.createdAt) ?? new Date(0)).getTime();
}

function queueSection(ctx, queues, lists, reload) {
  if (queues.length === 0) {
    return h('p', { class: 'banner ok' }, 'No dead jobs in any queue.');
  }
  return h(
    'section',
    { 'aria-labelledby': 'dead-queues' },
    h('h2', { id: 'dead-queues' }, 'By queue'),
    h(
      'div',
      { class: 'table-scroll', role: 'region', 'aria-label': 'Dead jobs by queue', tabindex: '0' },
      h(
        'table',
        { class: 'dead-queues' },
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', { scope: 'col' }, 'Queue'),
            h('th', { scope: 'col', class: 'num' }, 'Dead jobs'),
            h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')),
          ),
        ),
        h(
          'tbody',
          {},
          queues.map((q, i) => {
            const shown = lists[i].jobs?.length ?? 0;
            const total = num(q.dead);
            return h(
              'tr',
              {},
              h('th', { scope: 'row' }, h('a', { href: `#/queues/${encodeURIComponent(q.name)}?state=JOB_STATE_FAILED` }, q.name)),
              h(
                'td',
                { class: 'num' },
                formatCount(total),
                shown < total ? h('span', { class: 'muted' }, ` (newest ${formatCount(shown)} grouped below)`) : null,
              ),
              h('td', { class: 'actions' }, retryDeadButton(ctx, q.name, reload)),
            );
          }),
        ),
      ),
    ),
  );
}

function groupSection(ctx, groups, reload) {
  if (groups.length === 0) return null;
  return h(
    'section',
    { 'aria-labelledby': 'dead-errors' },
    h('h2', { id: 'dead-errors' }, 'By error'),
    h('ul', { class: 'groups' }, groups.map((g, i) => h('li', {}, groupCard(ctx, g, i, reload)))),
  );
}

function groupCard(ctx, g, index, reload) {
  const hid = `group-${index}`;
  const firstLine = g.error ? g.error.split('\n')[0] : '(no error text)';
  const title = firstLine.length > 120 ? `${firstLine.slice(0, 117)}…` : firstLine;
  const count = g.jobs.length;
  const more = count - LINKS_PER_GROUP;
  const retry = h('button', { type: 'button', class: 'small' }, `Retry ${count === 1 ? 'this job' : `these ${count} jobs`}`);
  retry.addEventListener('click', async () => {
    const ok = await confirmAction({
      title: `Retry ${formatCount(count)} ${count === 1 ? 'job' : 'jobs'}?`,
      message: `The dead ${count === 1 ? 'job' : 'jobs'} failing with “${title}” ${count === 1 ? 'goes' : 'go'} back to ready with attempts reset.`,
    });
    if (!ok) return;
    const done = await run(ctx, retry, async () => {
      let retried = 0;
      const errors = [];
      for (const job of g.jobs) {
        try {
          await ctx.api.retryJob(job.id);
          retried += 1;
        } catch (err) {
          errors.push(err.message);
        }
      }
      if (errors.length) throw new Error(`Retried ${retried} of ${count} jobs; ${errors.length} failed: ${errors[0]}`);
      return { result: retried, message: `Retried ${formatCount(retried)} ${retried === 1 ? 'job' : 'jobs'}.` };
    });
    if (done !== undefined) {
      ctx.refreshQueues();
      reload();
    }
  });
  return h(
    'article',
    { class: 'card group', 'aria-labelledby': hid },
    h(
      'h3',
      { id: hid },
      h('span', { class: 'count' }, `${formatCount(count)} ${count === 1 ? 'job' : 'jobs'}`),
      ' ',
      h('span', { class: 'error-text' }, title),
    ),
    g.error.length > title.length ? h('pre', { class: 'code error-text' }, g.error) : null,
    h(
      'dl',
      { class: 'details compact' },
      h(
        'div',
        {},
        h('dt', {}, [...g.queues.keys()].length === 1 ? 'Queue' : 'Queues'),
        h(
          'dd',
          {},
          [...g.queues].map(([q, n], i) => [
            i ? ', ' : '',
            h('a', { href: `#/queues/${encodeURIComponent(q)}?state=JOB_STATE_FAILED` }, q),
            ` (${formatCount(n)})`,
          ]),
        ),
      ),
      h('div', {}, h('dt', {}, 'Newest'), h('dd', {}, timeCell(g.newest))),
      h(
        'div',
        {},
        h('dt', {}, 'Jobs'),
        h(
          'dd',
          { class: 'job-links' },
          g.jobs.slice(0, LINKS_PER_GROUP).map((j, i) => [i ? ' ' : '', jobLink(j.id)]),
          more > 0 ? h('span', { class: 'muted' }, ` and ${formatCount(more)} more`) : null,
        ),
      ),
    ),
    h('div', { class: 'toolbar' }, retry),
  );
}
