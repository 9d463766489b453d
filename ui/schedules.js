// The schedules page (#/schedules): every recurring schedule with when it runs, its next and last
// runs (linked to the job the last one enqueued) and what is wrong with it, if anything; and the
// operator's actions: run now, pause or resume, delete. BullMQ's job schedulers and
// sidekiq-cron's page, for jobbroker. Refreshed on the app's 2-second poll.

import { h, replace, setText } from './dom.js';
import { polled } from './polled.js';
import { confirmAction } from './dialogs.js';
import { run } from './actions.js';
import { formatCount, formatDuration, parseDuration, parseTime } from './format.js';
import { jobLink, timeCell } from './jobstable.js';

// "cron 30 2 * * * (Europe/Berlin)" or "every 15 min".
function timing(s) {
  if (s.cron) return [h('code', {}, s.cron), s.timeZone ? ` (${s.timeZone})` : ' (UTC)'];
  return `every ${formatDuration(parseDuration(s.every))}`;
}

function status(s) {
  if (s.error) return h('span', { class: 'badge down' }, 'Error');
  if (s.paused) return h('span', { class: 'badge paused' }, 'Paused');
  if (!s.nextRunAt) return h('span', { class: 'badge' }, 'Ended');
  return h('span', { class: 'badge up' }, 'Active');
}

export function render(root, ctx) {
  ctx.setTitle('Schedules');
  const error = h('p', { class: 'banner error', role: 'alert', hidden: true });
  const summary = h('p', { class: 'totals muted', 'aria-live': 'polite' });
  const body = h('tbody');
  const empty = h(
    'p',
    { class: 'muted', hidden: true },
    'No recurring schedule. Create one with jobbroker-cli schedule put ID JSON, or Admin.PutSchedule.',
  );

  root.append(
    h('h1', { tabindex: '-1' }, 'Schedules'),
    error,
    summary,
    empty,
    h(
      'div',
      { class: 'table-scroll', role: 'region', 'aria-label': 'Schedules table', tabindex: '0' },
      h(
        'table',
        { class: 'schedules' },
        h('caption', { class: 'visually-hidden' }, 'Schedules'),
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', { scope: 'col' }, 'Schedule'),
            h('th', { scope: 'col' }, 'Runs'),
            h('th', { scope: 'col' }, 'Queue'),
            h('th', { scope: 'col' }, 'Status'),
            h('th', { scope: 'col' }, 'Next run'),
            h('th', { scope: 'col' }, 'Last run'),
            h('th', { scope: 'col' }, 'Actions'),
          ),
        ),
        body,
      ),
    ),
  );

  const refreshNow = () => view.onQueues();

  function actions(s) {
    const id = s.scheduleId;
    const runNow = h('button', { type: 'button', class: 'secondary small', 'aria-label': `Run now ${id}` }, 'Run now');
    runNow.addEventListener('click', async () => {
      await run(ctx, runNow, async () => {
        const r = await ctx.api.triggerSchedule(id);
        return { message: `Schedule ${id} enqueued job ${r.jobId}${r.deduplicated ? ' (already enqueued this second)' : ''}.` };
      });
      refreshNow();
    });
    const verb = s.paused ? 'Resume' : 'Pause';
    const pause = h('button', { type: 'button', class: 'secondary small', 'aria-label': `${verb} ${id}` }, verb);
    pause.addEventListener('click', async () => {
      await run(ctx, pause, async () => {
        // A Put replaces the whole schedule: the latest one read, with `paused` flipped.
        const latest = await ctx.api.getSchedule(id);
        const put = await ctx.api.putSchedule(id, { ...latest, paused: !latest.paused });
        return { message: `Schedule ${id} ${put.paused ? 'paused' : 'resumed'}.` };
      });
      refreshNow();
    });
    const del = h('button', { type: 'button', class: 'danger small', 'aria-label': `Delete ${id}` }, 'Delete');
    del.addEventListener('click', async () => {
      const ok = await confirmAction({
        title: `Delete schedule ${id}?`,
        message: 'It enqueues nothing more. The jobs it already enqueued stay.',
        confirmLabel: 'Delete',
        danger: true,
      });
      if (!ok) return;
      await run(ctx, del, async () => {
        await ctx.api.deleteSchedule(id);
        return { message: `Schedule ${id} deleted.` };
      });
      refreshNow();
    });
    return h('div', { class: 'actions' }, runNow, pause, del);
  }

  function show(schedules) {
    error.hidden = true;
    const now = new Date();
    const paused = schedules.filter((s) => s.paused).length;
    setText(
      summary,
      `${formatCount(schedules.length)} ${schedules.length === 1 ? 'schedule' : 'schedules'}` +
        (paused ? `, ${formatCount(paused)} paused` : ''),
    );
    empty.hidden = schedules.length > 0;
    replace(
      body,
      schedules.map((s) => {
        const queue = s.template?.queue ?? '';
        return h(
          'tr',
          { 'data-schedule': s.scheduleId },
          h('th', { scope: 'row', class: 'mono' }, s.scheduleId),
          h('td', {}, timing(s)),
          h('td', {}, h('a', { href: `#/queues/${encodeURIComponent(queue)}` }, queue)),
          h('td', {}, status(s), s.error ? h('div', { class: 'error-text' }, s.error) : ''),
          h('td', {}, s.paused ? h('span', { class: 'muted' }, 'paused') : timeCell(parseTime(s.nextRunAt), now)),
          h(
            'td',
            {},
            s.lastRunAt ? [timeCell(parseTime(s.lastRunAt), now), ' ', s.lastJobId ? jobLink(s.lastJobId) : ''] : '—',
          ),
          h('td', {}, actions(s)),
        );
      }),
    );
  }

  const view = polled({
    load: () => ctx.api.listSchedules(),
    show: (listed) => show(listed.schedules ?? []),
    error,
    what: 'list the schedules',
  });
  return view;
}
