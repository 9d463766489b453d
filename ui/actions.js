// The queue actions that several views offer (pause/resume, bulk retry of dead jobs, purge),
// each as a button that confirms when the action cannot be undone, calls the API and
// announces the outcome or the broker's error message.

import { h } from './dom.js';
import { confirmAction } from './dialogs.js';
import { formatCount, num, stateLabel, TERMINAL_STATES } from './format.js';

// Runs `fn` with `button` disabled; announces `fn`'s message, or the error. Resolves with
// fn's result, or undefined after an error.
export async function run(ctx, button, fn) {
  if (button) button.disabled = true;
  try {
    const { message, result } = await fn();
    ctx.announce(message, 'ok');
    return result;
  } catch (err) {
    ctx.announce(err.message, 'error');
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}

// "Pause" / "Resume" for a queue. `onChange(info)` gets the QueueInfo the broker returned.
// Pausing needs no confirmation: it is undone with one click and loses nothing.
export function pauseButton(ctx, info, onChange) {
  const button = h('button', { type: 'button', class: 'secondary small' });
  let name = info.name;
  let paused = false;
  const set = (q) => {
    name = q.name;
    paused = Boolean(q.policy?.paused);
    button.textContent = paused ? 'Resume' : 'Pause';
    button.setAttribute('aria-label', `${paused ? 'Resume' : 'Pause'} queue ${name}`);
  };
  set(info);
  button.addEventListener('click', async () => {
    const wasPaused = paused;
    const q = await run(ctx, button, async () => {
      const result = await (wasPaused ? ctx.api.resumeQueue(name) : ctx.api.pauseQueue(name));
      return { result, message: `Queue ${name} ${wasPaused ? 'resumed' : 'paused'}.` };
    });
    if (q) {
      set(q);
      onChange?.(q);
      ctx.refreshQueues();
    }
  });
  return { element: button, update: set };
}

// "Retry all dead jobs" of a queue: counts them first (dry run) so the confirmation can say
// how many will move back to ready.
export function retryDeadButton(ctx, queue, onDone) {
  const button = h(
    'button',
    { type: 'button', class: 'small', 'aria-label': `Retry all dead jobs of queue ${queue}` },
    'Retry all dead jobs',
  );
  button.addEventListener('click', async () => {
    button.disabled = true;
    let matched;
    try {
      matched = num((await ctx.api.retryQueue(queue, { dryRun: true, limit: 100000 })).matched);
    } catch (err) {
      ctx.announce(err.message, 'error');
      button.disabled = false;
      return;
    }
    button.disabled = false;
    if (matched === 0) {
      ctx.announce(`Queue ${queue} has no dead jobs to retry.`, 'ok');
      return;
    }
    const ok = await confirmAction({
      title: `Retry dead jobs of ${queue}?`,
      message: `${formatCount(matched)} dead ${matched === 1 ? 'job goes' : 'jobs go'} back to ready with their attempts reset. Their history is kept.`,
      confirmLabel: 'Confirm',
    });
    if (!ok) return;
    const res = await run(ctx, button, async () => {
      const r = await ctx.api.retryQueue(queue, { limit: 100000 });
      const n = num(r.retried);
      return { result: r, message: `Retried ${formatCount(n)} dead ${n === 1 ? 'job' : 'jobs'} of queue ${queue}.` };
    });
    if (res) {
      ctx.refreshQueues();
      onDone?.(res);
    }
  });
  return button;
}

// "Purge…": removes the queue's finished jobs in the states the user ticks (all three
// terminal states by default).
export function purgeButton(ctx, queue, onDone) {
  const button = h(
    'button',
    { type: 'button', class: 'secondary small danger-text', 'aria-label': `Purge finished jobs of queue ${queue}` },
    'Purge…',
  );
  button.addEventListener('click', async () => {
    const boxes = TERMINAL_STATES.map((state) => h('input', { type: 'checkbox', value: state, checked: true }));
    const details = h(
      'fieldset',
      { class: 'checks' },
      h('legend', {}, 'Remove the jobs that are'),
      boxes.map((box) => h('label', {}, box, ' ', stateLabel(box.value))),
    );
    const ok = await confirmAction({
      title: `Purge queue ${queue}?`,
      message: 'The chosen finished jobs are deleted for good. Waiting, ready, scheduled and active jobs are kept.',
      details,
      confirmLabel: 'Confirm',
      danger: true,
    });
    if (!ok) return;
    const states = boxes.filter((b) => b.checked).map((b) => b.value);
    if (states.length === 0) {
      ctx.announce('Nothing purged: no state was chosen.', 'error');
      return;
    }
    const res = await run(ctx, button, async () => {
      const r = await ctx.api.purgeQueue(queue, states);
      const n = num(r.purged);
      return { result: r, message: `Purged ${formatCount(n)} ${n === 1 ? 'job' : 'jobs'} from queue ${queue}.` };
    });
    if (res) {
      ctx.refreshQueues();
      onDone?.(res);
    }
  });
  return button;
}
