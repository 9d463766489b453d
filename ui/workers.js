// The workers page (#/workers, or #/workers?queue=<name>): every connected worker with its
// queues, its open streams and waiting Lease calls, and the attempts it is running, each linked
// to its job with its progress. Sidekiq's Busy page, for jobbroker. Refreshed on the app's
// 2-second poll. A worker that went away while holding jobs is listed until their leases end.

import { h, replace, setText } from './dom.js';
import { polled } from './polled.js';
import { formatAgo, formatCount, parseTime } from './format.js';
import { progressView } from './job.js';
import { timeCell } from './jobstable.js';

export function render(root, ctx, r) {
  const queue = r.params.get('queue') ?? '';
  ctx.setTitle(queue ? `Workers of ${queue}` : 'Workers');
  const error = h('p', { class: 'banner error', role: 'alert', hidden: true });
  const summary = h('p', { class: 'totals muted', 'aria-live': 'polite' });
  const body = h('tbody');
  const empty = h(
    'p',
    { class: 'muted', hidden: true },
    queue
      ? `No worker takes or runs jobs of ${queue} now.`
      : 'No worker is connected, and none holds a job. Workers appear here once they open a Work stream or lease a job.',
  );

  root.append(
    h('h1', { tabindex: '-1' }, queue ? ['Workers of ', h('a', { href: `#/queues/${encodeURIComponent(queue)}` }, queue)] : 'Workers'),
    error,
    summary,
    empty,
    h(
      'div',
      { class: 'table-scroll', role: 'region', 'aria-label': 'Workers table', tabindex: '0' },
      h(
        'table',
        { class: 'workers' },
        h('caption', { class: 'visually-hidden' }, 'Workers'),
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', { scope: 'col' }, 'Worker'),
            h('th', { scope: 'col' }, 'Queues'),
            h('th', { scope: 'col', class: 'num' }, 'Connections'),
            h('th', { scope: 'col', class: 'num' }, 'Running'),
            h('th', { scope: 'col' }, 'Connected'),
            h('th', { scope: 'col' }, 'Jobs it runs'),
          ),
        ),
        body,
      ),
    ),
  );


  function runningJob(job, now) {
    const started = parseTime(job.startedAt);
    return h(
      'li',
      { 'data-job': job.jobId },
      h('a', { href: `#/jobs/${encodeURIComponent(job.jobId)}`, class: 'mono' }, job.jobId),
      ` ${job.queue}, attempt ${job.attempt ?? 0}`,
      started ? h('span', { class: 'muted' }, `, started ${formatAgo(started, now)}`) : '',
      job.progress ? [' ', progressView(job.progress)] : '',
    );
  }

  function show(workers) {
    error.hidden = true;
    const now = new Date();
    const running = workers.reduce((n, w) => n + (w.running ?? []).length, 0);
    setText(
      summary,
      `${formatCount(workers.length)} ${workers.length === 1 ? 'worker' : 'workers'}, ` +
        `${formatCount(running)} ${running === 1 ? 'job' : 'jobs'} running`,
    );
    empty.hidden = workers.length > 0;
    replace(
      body,
      workers.map((w) => {
        const jobs = w.running ?? [];
        const connections = (w.streams ?? 0) + (w.leaseWaits ?? 0);
        const connected = parseTime(w.connectedAt);
        return h(
          'tr',
          { 'data-worker': w.workerId },
          h('th', { scope: 'row', class: 'mono' }, w.workerId || h('span', { class: 'muted' }, '(no id)')),
          h(
            'td',
            {},
            (w.queues ?? []).map((q, i) => [i > 0 ? ', ' : '', h('a', { href: `#/queues/${encodeURIComponent(q)}` }, q)]),
          ),
          h(
            'td',
            { class: 'num', title: `${w.streams ?? 0} Work streams, ${w.leaseWaits ?? 0} waiting Lease calls` },
            connections === 0 ? h('span', { class: 'muted' }, 'none') : formatCount(connections),
          ),
          h('td', { class: 'num' }, w.maxInFlight ? `${jobs.length} of ${w.maxInFlight}` : formatCount(jobs.length)),
          h('td', {}, connected ? timeCell(connected, now) : '—'),
          h(
            'td',
            {},
            jobs.length === 0
              ? h('span', { class: 'muted' }, 'idle')
              : h(
                  'ul',
                  { class: 'plain' },
                  jobs.map((j) => runningJob(j, now)),
                ),
          ),
        );
      }),
    );
  }

  return polled({
    load: () => ctx.api.listWorkers(queue),
    show: (listed) => show(listed.workers ?? []),
    error,
    what: 'list the workers',
  });
}
