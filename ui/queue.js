// One queue (#/queues/<name>?state=...&dedupKey=...): its figures and actions, tabs by state,
// a search by job id or dedup key, and the jobs newest first, a page at a time.

import { h, replace, setText } from './dom.js';
import { pauseButton, purgeButton, retryDeadButton } from './actions.js';
import { jobsTable } from './jobstable.js';
import {
  STATES,
  formatCount,
  formatDuration,
  looksLikeJobId,
  num,
  parseDuration,
  stateLabel,
} from './format.js';

const PAGE_SIZE = 50;

export function render(root, ctx, { name, params }) {
  const state = params.get('state') ?? '';
  const dedupKey = params.get('dedupKey') ?? '';
  const base = `#/queues/${encodeURIComponent(name)}`;
  ctx.setTitle(`Queue ${name}`);

  const badge = h('span', { class: 'badge paused', hidden: true }, 'Paused');
  const stats = h('dl', { class: 'stats' });
  const tools = h('div', { class: 'toolbar' });
  const tabLinks = new Map();
  const tabs = h(
    'nav',
    { class: 'tabs', 'aria-label': 'Job states' },
    h(
      'ul',
      {},
      [{ name: '', label: 'All' }, ...STATES].map((s) => {
        const link = h('a', { href: s.name ? `${base}?state=${s.name}` : base }, s.label);
        if (s.name === state && !dedupKey) link.setAttribute('aria-current', 'page');
        tabLinks.set(s.name, { link, label: s.label });
        return h('li', {}, link);
      }),
    ),
  );

  const searchInput = h('input', { id: 'job-search', type: 'search', value: dedupKey, autocomplete: 'off', spellcheck: 'false' });
  const search = h(
    'form',
    { role: 'search', class: 'search', 'aria-label': `Jobs of ${name}` },
    h('label', { for: 'job-search' }, 'Job id or dedup key'),
    h('div', { class: 'search-row' }, searchInput, h('button', { type: 'submit' }, 'Search')),
  );
  search.addEventListener('submit', (e) => {
    e.preventDefault();
    find(ctx, name, searchInput.value.trim());
  });

  const listHeading = h('h2', { id: 'jobs-heading' });
  const list = h('div', { class: 'job-list' });
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' });

  root.append(
    h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/' }, 'Queues'), ' › ', name),
    h('h1', { tabindex: '-1' }, `Queue ${name} `, badge),
    stats,
    tools,
    tabs,
    search,
    h('section', { 'aria-labelledby': 'jobs-heading' }, listHeading, list, pager),
  );

  // --- The queue's figures, refreshed by every poll. ---
  let pause = null;
  function showInfo(q) {
    badge.hidden = !q.policy?.paused;
    const limit = num(q.policy?.maxConcurrency);
    const age = parseDuration(q.oldestReadyAge);
    const items = [
      ['Active', `${formatCount(q.active)} of ${limit ? formatCount(limit) : 'unlimited'}`],
      ['Oldest ready', age > 0 ? formatDuration(age) : '—'],
      ['Idle workers waiting', h('a', { href: `#/workers?queue=${encodeURIComponent(name)}` }, formatCount(q.waitingLeases))],
      ['Failed (dead)', formatCount(q.dead)],
    ];
    replace(stats, items.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, v))));
    for (const [stateName, { link, label }] of tabLinks) {
      const text = stateName ? `${label} ${formatCount(q.counts?.[stateName])}` : label;
      setText(link, text);
    }
    if (!pause) {
      pause = pauseButton(ctx, q, showInfo);
      const refresh = () => loadPage();
      tools.append(
        pause.element,
        retryDeadButton(ctx, name, refresh),
        purgeButton(ctx, name, refresh),
        h('button', { type: 'button', class: 'secondary small', onclick: refresh }, 'Refresh list'),
      );
    } else {
      pause.update(q);
    }
  }

  // --- The job list, one page at a time; tokens[i] fetches page i. ---
  const tokens = [''];
  let page = 0;
  let disposed = false;

  async function loadPage() {
    const what = dedupKey ? `Job with dedup key “${dedupKey}”` : `${state ? stateLabel(state) : 'All'} jobs, newest first`;
    setText(listHeading, what);
    list.setAttribute('aria-busy', 'true');
    try {
      const res = await ctx.api.listJobs(name, {
        state: dedupKey ? '' : state,
        pageSize: PAGE_SIZE,
        pageToken: tokens[page],
        newestFirst: true,
        dedupKey,
      });
      if (disposed) return;
      const jobs = res.jobs ?? [];
      tokens.length = page + 1;
      if (res.nextPageToken) tokens.push(res.nextPageToken);
      if (jobs.length === 0) {
        replace(
          list,
          h('p', { class: 'muted' }, dedupKey ? `No job of queue ${name} holds the dedup key “${dedupKey}”.` : 'No jobs here.'),
        );
      } else {
        replace(list, jobsTable(jobs, `Table of jobs in queue ${name}`));
      }
      drawPager(jobs.length);
    } catch (err) {
      if (disposed) return;
      replace(list, h('p', { class: 'banner error', role: 'alert' }, err.message));
      pager.replaceChildren();
    } finally {
      list.removeAttribute('aria-busy');
    }
  }

  function drawPager(count) {
    const prev = h('button', { type: 'button', class: 'secondary small', disabled: page === 0 }, 'Previous page');
    const next = h('button', { type: 'button', class: 'secondary small', disabled: page + 1 >= tokens.length }, 'Next page');
    prev.addEventListener('click', () => {
      page -= 1;
      loadPage().then(() => listHeading.scrollIntoView({ block: 'nearest' }));
    });
    next.addEventListener('click', () => {
      page += 1;
      loadPage().then(() => listHeading.scrollIntoView({ block: 'nearest' }));
    });
    const first = page * PAGE_SIZE + 1;
    const shown = count ? `Jobs ${formatCount(first)}–${formatCount(first + count - 1)}` : '';
    replace(pager, prev, h('span', { class: 'muted' }, `Page ${page + 1}`, shown ? ` · ${shown}` : ''), next);
  }

  // The queue itself first: a 404 here is the clearest way to say the name is unknown.
  ctx.api
    .getQueue(name)
    .then((q) => {
      if (disposed) return;
      showInfo(q);
      loadPage();
    })
    .catch((err) => {
      if (disposed) return;
      replace(list, h('p', { class: 'banner error', role: 'alert' }, err.message));
    });

  return {
    onQueues(queues) {
      const q = queues.find((x) => x.name === name);
      if (q && pause) showInfo(q);
    },
    dispose() {
      disposed = true;
    },
  };
}

// The search box: a job id opens the job (wherever it is); anything else, or an id that is
// not a job, lists the job of this queue that holds it as dedup key.
async function find(ctx, queue, text) {
  const base = `#/queues/${encodeURIComponent(queue)}`;
  if (!text) {
    ctx.navigate(base);
    return;
  }
  if (looksLikeJobId(text)) {
    try {
      const job = await ctx.api.getJob(text.toUpperCase());
      ctx.navigate(`#/jobs/${encodeURIComponent(job.id)}`);
      return;
    } catch (err) {
      if (err.status !== 404) {
        ctx.announce(err.message, 'error');
        return;
      }
    }
  }
  ctx.navigate(`${base}?dedupKey=${encodeURIComponent(text)}`);
}
