// One job (#/jobs/<id>): its state and timings, the jobs it waits for and those waiting for it,
// payload, headers, attempt history, error, checkpoint and result, and the actions its state
// allows (retry, cancel, delete).

import { h, replace } from './dom.js';
import { confirmAction } from './dialogs.js';
import { run } from './actions.js';
import { stateBadge, timeCell } from './jobstable.js';
import {
  decodeBase64,
  formatBytes,
  formatCount,
  formatDuration,
  humanEnum,
  parseDuration,
  parseTime,
  renderBytes,
  stateLabel,
} from './format.js';

export function render(root, ctx, { id }) {
  ctx.setTitle(`Job ${id}`);
  const crumbs = h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/' }, 'Queues'));
  const heading = h('h1', { tabindex: '-1' }, 'Job ', h('span', { class: 'mono' }, id));
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  root.append(crumbs, heading, body);
  let disposed = false;

  async function load() {
    try {
      const job = await ctx.api.getJob(id);
      if (!disposed) show(job);
    } catch (err) {
      if (!disposed) replace(body, h('p', { class: 'banner error', role: 'alert' }, err.message));
    }
  }

  function show(job) {
    const queueHref = `#/queues/${encodeURIComponent(job.queue)}`;
    replace(crumbs, h('a', { href: '#/' }, 'Queues'), ' › ', h('a', { href: queueHref }, job.queue), ' › ', 'Job');
    replace(heading, 'Job ', h('span', { class: 'mono' }, job.id), ' ', stateBadge(job.state));
    replace(
      body,
      actions(ctx, job, load),
      section('Details', details(ctx, job)),
      job.lastError || job.state === 'JOB_STATE_FAILED'
        ? section('Last error', h('pre', { class: 'code error-text' }, job.lastError || '(no error text)'))
        : null,
      bytesSection('Payload', job.payload),
      section('Headers', headersTable(job.headers ?? {})),
      section('Attempts', attemptsTable(job.attempts ?? [])),
      bytesSection('Checkpoint', job.checkpoint),
      bytesSection('Result', job.result),
    );
  }

  load();
  return {
    dispose() {
      disposed = true;
    },
  };
}

// A titled region: a landmark screen-reader users can jump to, named by its heading.
function section(title, ...content) {
  const hid = `sec-${title.toLowerCase().replaceAll(' ', '-')}`;
  return h('section', { class: 'card', 'aria-labelledby': hid }, h('h2', { id: hid }, title), content);
}

function details(ctx, job) {
  const now = new Date();
  const when = (ts) => (parseTime(ts) ? [timeCell(parseTime(ts), now), ' ', h('span', { class: 'muted' }, `(${relative(ts, now)})`)] : '—');
  const rows = [
    ['Queue', h('a', { href: `#/queues/${encodeURIComponent(job.queue)}` }, job.queue)],
    ['State', stateLabel(job.state)],
    job.state === 'JOB_STATE_FAILED' ? ['Fail reason', humanEnum(job.failReason, 'FAIL_REASON_') || '—'] : null,
    job.cancelRequested ? ['Cancel requested', 'Yes: the worker is told at its next heartbeat'] : null,
    ['Attempt', `${job.attempt ?? 0} of ${job.maxAttempts ?? 0}`],
    ['Priority', String(job.priority ?? 0)],
    ['Created', when(job.createdAt)],
    job.runAt ? ['Run at', when(job.runAt)] : null,
    job.leaseDeadline ? ['Lease deadline', when(job.leaseDeadline)] : null,
    job.timeoutAt ? ['Times out', when(job.timeoutAt)] : null,
    job.timeout ? ['Run-time limit', formatDuration(parseDuration(job.timeout))] : null,
    job.expireAt ? ['Expires', when(job.expireAt)] : null,
    job.snoozes ? ['Snoozes', String(job.snoozes)] : null,
    job.progress ? ['Progress', progressView(job.progress)] : null,
    job.dependsOn?.length ? ['Waits for', dependencies(job)] : null,
    job.dependents?.length ? ['Needed by', dependents(ctx, job.dependents)] : null,
    job.completedAt ? ['Ended', when(job.completedAt)] : null,
    job.completedAt && job.createdAt ? ['Total time', span(job.createdAt, job.completedAt)] : null,
    ['Dedup key', job.dedupKey ? h('span', { class: 'mono' }, job.dedupKey) : '—'],
    ['Concurrency key', job.concurrencyKey ? h('span', { class: 'mono' }, job.concurrencyKey) : '—'],
    ['Idempotency key', h('span', { class: 'mono' }, job.idempotencyKey || '—')],
  ].filter(Boolean);
  return h('dl', { class: 'details' }, rows.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v))));
}

// A dependency's result in one short line: "result: 42", "result: (empty)", "result: 3 bytes".
function resultText(base64) {
  const shown = renderBytes(base64);
  if (shown.kind === 'empty') return 'result: (empty)';
  if (shown.kind === 'binary') return `result: ${formatBytes(shown.size)}`;
  const text = shown.text.replace(/\s+/g, ' ');
  return `result: ${text.length > 60 ? `${text.slice(0, 60)}…` : text}`;
}

// The jobs it depends on, each linked, with its result once all have completed.
function dependencies(job) {
  const results = job.dependencyResults ?? {};
  return h(
    'ul',
    { class: 'plain' },
    job.dependsOn.map((id) =>
      h(
        'li',
        {},
        h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'mono' }, id),
        id in results ? [' ', h('span', { class: 'muted' }, resultText(results[id]))] : '',
      ),
    ),
  );
}

// The most dependents listed (and looked up, one request each) on a job's page.
const SHOWN_DEPENDENTS = 20;

// The jobs that wait for this one (Job.dependents: those of its partition), each linked, with
// its state once its own request answers. A job that thousands wait for lists the first few.
function dependents(ctx, ids) {
  const shown = ids.slice(0, SHOWN_DEPENDENTS);
  const more = ids.length - shown.length;
  return [
    h(
      'ul',
      { class: 'plain' },
      shown.map((id) => {
        const state = h('span');
        ctx.api.getJob(id).then(
          (dependent) => replace(state, ' ', stateBadge(dependent.state)),
          (err) => {
            if (err.status === 404) replace(state, ' ', h('span', { class: 'muted' }, 'deleted'));
          },
        );
        return h('li', {}, h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'mono' }, id), state);
      }),
    ),
    more > 0 ? h('p', { class: 'muted' }, `and ${formatCount(more)} more`) : null,
  ];
}

// A worker's progress report (Job.progress, base64 bytes): a bar when it is JSON with a
// numeric "percent", with the whole report as text beside it.
export function progressView(base64) {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(decodeBase64(base64));
  } catch {
    return h('span', { class: 'muted' }, 'binary');
  }
  let percent = null;
  try {
    const value = JSON.parse(text);
    if (value && typeof value.percent === 'number' && Number.isFinite(value.percent)) {
      percent = Math.min(100, Math.max(0, value.percent));
    }
  } catch {
    // Not JSON: shown as text.
  }
  const shown = h('span', { class: 'mono' }, text.length > 200 ? `${text.slice(0, 200)}…` : text);
  if (percent === null) return shown;
  return [h('progress', { max: '100', value: String(percent), 'aria-label': `Progress ${percent}%` }), ' ', shown];
}

function relative(ts, now) {
  const seconds = (now - parseTime(ts)) / 1000;
  return seconds >= 0 ? `${formatDuration(seconds)} ago` : `in ${formatDuration(-seconds)}`;
}

function span(from, to) {
  return formatDuration((parseTime(to) - parseTime(from)) / 1000);
}

// Payload, checkpoint or result: JSON pretty-printed, other UTF-8 as text, else a hex dump.
function bytesSection(title, base64) {
  const r = renderBytes(base64 ?? '');
  if (r.kind === 'empty') return section(title, h('p', { class: 'muted' }, 'Empty.'));
  const kind = { json: 'JSON', text: 'Text', binary: 'Binary, shown as hex' }[r.kind];
  return section(
    title,
    h('p', { class: 'muted meta' }, `${kind} · ${formatBytes(r.size)}`, r.truncated ? ' · only the first 64 KiB shown' : ''),
    h('pre', { class: `code bytes-${r.kind}`, tabindex: '0', 'aria-label': `${title} (${kind})` }, r.text),
  );
}

function headersTable(headers) {
  const names = Object.keys(headers).sort();
  if (names.length === 0) return h('p', { class: 'muted' }, 'None.');
  return scroll(
    'Headers',
    h(
      'table',
      {},
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Name'), h('th', { scope: 'col' }, 'Value'))),
      h(
        'tbody',
        {},
        names.map((n) => h('tr', {}, h('th', { scope: 'row', class: 'mono' }, n), h('td', { class: 'mono wrap' }, headers[n]))),
      ),
    ),
  );
}

function attemptsTable(attempts) {
  if (attempts.length === 0) return h('p', { class: 'muted' }, 'Not run yet.');
  const now = new Date();
  return scroll(
    'Attempts',
    h(
      'table',
      {},
      h(
        'thead',
        {},
        h('tr', {}, ['#', 'Worker', 'Started', 'Ended', 'Duration', 'Outcome', 'Error'].map((t) => h('th', { scope: 'col' }, t))),
      ),
      h(
        'tbody',
        {},
        attempts.map((a) => {
          const started = parseTime(a.startedAt);
          const ended = parseTime(a.endedAt);
          const running = !ended;
          const took = started ? formatDuration(((ended ?? now) - started) / 1000) : '—';
          return h(
            'tr',
            {},
            h('th', { scope: 'row', class: 'num' }, String(a.attempt ?? '')),
            h('td', { class: 'mono' }, a.workerId || '—'),
            h('td', {}, timeCell(started, now)),
            h('td', {}, running ? 'running' : timeCell(ended, now)),
            h('td', { class: 'num' }, running ? `${took} so far` : took),
            h('td', {}, running ? 'Running' : humanEnum(a.outcome, 'ATTEMPT_OUTCOME_')),
            h('td', { class: 'error-text wrap' }, a.error || ''),
          );
        }),
      ),
    ),
  );
}

// A focusable scroller, so the keyboard can scroll a wide table on a phone.
function scroll(label, table) {
  return h('div', { class: 'table-scroll', role: 'region', 'aria-label': `${label} table`, tabindex: '0' }, table);
}

// The buttons the job's state allows. Each confirms first, then reloads the job (or, after a
// delete, goes to its queue) and announces what happened.
function actions(ctx, job, reload) {
  const s = job.state;
  const bar = h('div', { class: 'toolbar' });
  const add = (label, opts, doIt) => {
    const button = h('button', { type: 'button', class: opts.danger ? 'danger' : '' }, label);
    button.addEventListener('click', async () => {
      const ok = await confirmAction({ ...opts, confirmLabel: 'Confirm' });
      if (!ok) return;
      const done = await run(ctx, button, doIt);
      if (done !== undefined) await reload();
    });
    bar.append(button);
  };
  if (s === 'JOB_STATE_FAILED' || s === 'JOB_STATE_CANCELLED') {
    add('Retry job', { title: 'Retry this job?', message: `Job ${job.id} goes back to ready with its attempts reset. Its history is kept.` }, async () => {
      const r = await ctx.api.retryJob(job.id);
      return { result: r, message: `Job ${job.id} is ready to run again.` };
    });
  }
  if (s === 'JOB_STATE_WAITING' || s === 'JOB_STATE_READY' || s === 'JOB_STATE_SCHEDULED' || s === 'JOB_STATE_ACTIVE') {
    const active = s === 'JOB_STATE_ACTIVE';
    // Jobs that wait for this one fail (DEPENDENCY_FAILED) when it is cancelled.
    const waiting = job.dependents?.length ?? 0;
    const dependents =
      waiting === 0 ? '' : waiting === 1 ? ' The job that waits for it will fail.' : ` The ${formatCount(waiting)} jobs that wait for it will fail.`;
    add(
      'Cancel job',
      {
        title: 'Cancel this job?',
        message: active
          ? `Job ${job.id} is running: its worker is asked to stop at its next heartbeat.${dependents}`
          : `Job ${job.id} will not run. It can be retried later.${dependents}`,
        danger: true,
      },
      async () => {
        const r = await ctx.api.cancelJob(job.id);
        const message = r.state === 'JOB_STATE_CANCELLED' ? `Job ${job.id} cancelled.` : `Cancellation of job ${job.id} requested; its worker is told at its next heartbeat.`;
        return { result: r, message };
      },
    );
  }
  if (s !== 'JOB_STATE_ACTIVE') {
    const button = h('button', { type: 'button', class: 'danger' }, 'Delete job');
    button.addEventListener('click', async () => {
      const ok = await confirmAction({
        title: 'Delete this job?',
        message: `Job ${job.id} and its history are removed for good.`,
        confirmLabel: 'Confirm',
        danger: true,
      });
      if (!ok) return;
      const done = await run(ctx, button, async () => {
        await ctx.api.deleteJob(job.id);
        return { result: true, message: `Job ${job.id} deleted.` };
      });
      if (done) ctx.navigate(`#/queues/${encodeURIComponent(job.queue)}`);
    });
    bar.append(button);
  }
  bar.append(h('button', { type: 'button', class: 'secondary', onclick: () => reload() }, 'Refresh'));
  return bar;
}
