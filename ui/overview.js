// The queue overview (#/): the total throughput chart, then one table row per queue with its
// counts by state, concurrency, oldest ready age, rates, a sparkline and Pause/Resume.
// Rows are updated in place on every poll so keyboard focus and selections survive.

import { h, replace, setText } from './dom.js';
import { chartWindow, rateChart } from './chart.js';
import { pauseButton } from './actions.js';
import { STATES, formatCount, formatDuration, formatRate, num, parseDuration } from './format.js';

export function render(root, ctx) {
  ctx.setTitle('Queues');
  const error = h('p', { class: 'banner error', role: 'alert', hidden: true });
  const totals = h('p', { class: 'totals muted' });
  const chartBox = h('div', { class: 'chart-box' });
  const legend = h('p', { class: 'legend' });
  const tbody = h('tbody');
  const empty = h(
    'p',
    { class: 'muted', hidden: true },
    'No queues yet. A queue appears when a job is enqueued to it, a worker leases from it or a policy names it.',
  );
  const table = h(
    'table',
    { class: 'queues' },
    h('caption', { class: 'visually-hidden' }, 'Queues with their jobs by state'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { scope: 'col' }, 'Queue'),
        STATES.map((s) => h('th', { scope: 'col', class: 'num' }, s.name === 'JOB_STATE_ACTIVE' ? 'Active / limit' : s.label)),
        h('th', { scope: 'col', class: 'num' }, 'Oldest ready'),
        h('th', { scope: 'col' }, 'Jobs per second'),
        h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')),
      ),
    ),
    tbody,
  );

  const scroller = h('div', { class: 'table-scroll', role: 'region', 'aria-label': 'Queues table', tabindex: '0' }, table);

  root.append(
    h('h1', { tabindex: '-1' }, 'Queues'),
    error,
    totals,
    h(
      'section',
      { class: 'card', 'aria-labelledby': 'throughput-heading' },
      h('h2', { id: 'throughput-heading' }, 'Throughput, all queues'),
      legend,
      chartBox,
    ),
    h(
      'section',
      { 'aria-labelledby': 'queues-heading' },
      h('h2', { id: 'queues-heading', class: 'visually-hidden' }, 'Queues'),
      empty,
      scroller,
    ),
  );

  const rows = new Map(); // queue name -> Row

  function drawChart() {
    const now = Date.now();
    const points = ctx.rates.total;
    const latest = points[points.length - 1];
    if (!ctx.rates.supported) {
      replace(legend, 'This broker does not report enqueue and completion counters, so no rates can be shown.');
      chartBox.replaceChildren();
      return;
    }
    replace(
      legend,
      h('span', { class: 'key key-enqueue' }, 'Enqueued ', h('strong', {}, formatRate(latest?.enqueue))),
      h('span', { class: 'key key-complete' }, 'Completed ', h('strong', {}, formatRate(latest?.complete))),
    );
    const width = chartBox.clientWidth || 600;
    const windowMs = chartWindow(points, now);
    const label = latest
      ? `Jobs per second over the last ${formatDuration(windowMs / 1000)}: enqueued ${formatRate(latest.enqueue)}, completed ${formatRate(latest.complete)} now`
      : 'Jobs per second: collecting the first samples';
    replace(chartBox, rateChart(points, { width, height: 160, now, windowMs, label }));
  }

  function update(queues) {
    error.hidden = true;
    empty.hidden = queues.length > 0;
    scroller.hidden = queues.length === 0;
    let ready = 0;
    let active = 0;
    let dead = 0;
    for (const q of queues) {
      ready += num(q.counts?.JOB_STATE_READY);
      active += num(q.active);
      dead += num(q.dead);
    }
    setText(
      totals,
      `${formatCount(queues.length)} ${queues.length === 1 ? 'queue' : 'queues'} · ${formatCount(ready)} ready · ` +
        `${formatCount(active)} active · ${formatCount(dead)} failed`,
    );
    const names = new Set(queues.map((q) => q.name));
    for (const [name, row] of rows) {
      if (!names.has(name)) {
        row.tr.remove();
        rows.delete(name);
      }
    }
    const windowMs = chartWindow(ctx.rates.total, Date.now());
    queues.forEach((q, i) => {
      let row = rows.get(q.name);
      if (!row) rows.set(q.name, (row = new Row(ctx, q)));
      row.update(q, windowMs);
      // Re-insert only rows out of place: moving a node would drop the focus inside it.
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] ?? null);
    });
    drawChart();
  }

  const onResize = () => drawChart();
  window.addEventListener('resize', onResize);

  return {
    onQueues: update,
    onPollError(err) {
      // setText: an unchanged message is not announced again on every poll.
      setText(
        error,
        err.starting
          ? `The broker is starting (${err.message.replace(/^the broker is starting: /, '')}). The queues appear once it serves.`
          : `Could not load the queues: ${err.message}`,
      );
      // Not a failure: a notice until the start is over (update() hides it).
      error.classList.toggle('warn', Boolean(err.starting));
      error.classList.toggle('error', !err.starting);
      error.hidden = false;
    },
    dispose() {
      window.removeEventListener('resize', onResize);
    },
  };
}

// One queue's row. Cells are created once; update() changes their text.
class Row {
  constructor(ctx, info) {
    this.ctx = ctx;
    const name = info.name;
    const base = `#/queues/${encodeURIComponent(name)}`;
    this.badge = h('span', { class: 'badge paused', hidden: true }, 'Paused');
    this.counts = new Map();
    this.pause = pauseButton(ctx, info, (q) => this.update(q, null));
    this.spark = h('span', { class: 'spark' });
    this.oldest = h('td', { class: 'num' });
    this.enqueueRate = h('span');
    this.completeRate = h('span');
    const countCells = STATES.map((s) => {
      const link = h('a', { href: `${base}?state=${s.name}` });
      this.counts.set(s.name, link);
      return h('td', { class: 'num' }, link);
    });
    this.tr = h(
      'tr',
      {},
      h('th', { scope: 'row' }, h('a', { href: base, class: 'queue-name' }, name), ' ', this.badge),
      countCells,
      this.oldest,
      h('td', {}, h('span', { class: 'rate-cell' }, this.spark, h('span', { class: 'rate-text' }, this.enqueueRate, this.completeRate))),
      h('td', { class: 'actions' }, this.pause.element),
    );
  }

  update(q, windowMs) {
    const name = q.name;
    this.badge.hidden = !q.policy?.paused;
    this.tr.classList.toggle('is-paused', Boolean(q.policy?.paused));
    for (const s of STATES) {
      const link = this.counts.get(s.name);
      const n = num(q.counts?.[s.name]);
      let text = formatCount(n);
      let label = `${s.label} jobs in ${name}: ${n}`;
      if (s.name === 'JOB_STATE_ACTIVE') {
        const limit = num(q.policy?.maxConcurrency);
        text += limit ? ` / ${formatCount(limit)}` : ' / ∞';
        label += limit ? ` of at most ${limit}` : ', no limit';
      }
      setText(link, text);
      if (link.getAttribute('aria-label') !== label) link.setAttribute('aria-label', label);
      link.classList.toggle('zero', n === 0);
      link.classList.toggle('alert', s.name === 'JOB_STATE_FAILED' && n > 0);
    }
    const age = parseDuration(q.oldestReadyAge);
    setText(this.oldest, age > 0 ? formatDuration(age) : '—');
    this.pause.update(q);
    if (windowMs === null) return; // an action's answer: the rates did not change
    const latest = this.ctx.rates.latest(name);
    const known = this.ctx.rates.supported;
    setText(this.enqueueRate, `${known ? formatRate(latest?.enqueue) : '—'} in`);
    setText(this.completeRate, `${known ? formatRate(latest?.complete) : '—'} done`);
    replace(
      this.spark,
      rateChart(this.ctx.rates.series(name), { width: 96, height: 28, now: Date.now(), windowMs, compact: true }),
    );
  }
}
