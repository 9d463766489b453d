// A table of jobs (a page of a queue's list) with a link to each job's page.

import { h } from './dom.js';
import { formatAgo, formatTime, parseTime, stateLabel } from './format.js';

// `caption` names the table for screen readers.
export function jobsTable(jobs, caption) {
  const now = new Date();
  return h(
    'div',
    { class: 'table-scroll', role: 'region', 'aria-label': caption, tabindex: '0' },
    h(
      'table',
      { class: 'jobs' },
      h('caption', { class: 'visually-hidden' }, caption),
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          ['Job', 'State', 'Created', 'Attempt', 'Priority', 'Dedup key', 'Last error'].map((t) =>
            h('th', { scope: 'col' }, t),
          ),
        ),
      ),
      h('tbody', {}, jobs.map((job) => row(job, now))),
    ),
  );
}

function row(job, now) {
  return h(
    'tr',
    {},
    h('th', { scope: 'row' }, jobLink(job.id)),
    h('td', {}, stateBadge(job.state)),
    h('td', {}, timeCell(parseTime(job.createdAt), now)),
    h('td', { class: 'num' }, `${job.attempt ?? 0} / ${job.maxAttempts ?? 0}`),
    h('td', { class: 'num' }, String(job.priority ?? 0)),
    h('td', { class: 'mono clip' }, job.dedupKey || '—'),
    h('td', { class: 'clip error-text', title: job.lastError || null }, job.lastError || ''),
  );
}

export function jobLink(id) {
  return h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'mono' }, id);
}

// The state as a word (never colour alone) in a tinted pill.
export function stateBadge(state) {
  const cls = (state ?? '').replace('JOB_STATE_', '').toLowerCase();
  return h('span', { class: `badge state-${cls}` }, stateLabel(state));
}

// "2026-12-01 09:40:05" with the relative age as a tooltip and for machines in datetime.
export function timeCell(date, now = new Date()) {
  if (!date) return '—';
  return h('time', { datetime: date.toISOString(), title: formatAgo(date, now) }, formatTime(date));
}
