// The dashboard's entry point: hash routing between the views, the 2-second poll of the queue
// list that feeds the rate charts, the sign-in flow, and the announcement region.

import * as api from './client.js';
import { askToken } from './dialogs.js';
import { RateTracker } from './rates.js';
import * as overview from './overview.js';
import * as queue from './queue.js';
import * as job from './job.js';
import * as failed from './failed.js';
import * as cluster from './cluster.js';
import * as schedules from './schedules.js';
import * as workers from './workers.js';
import { h } from './dom.js';

const POLL_MS = 2000;
const view = document.getElementById('view');
const announceEl = document.getElementById('announce');
const rates = new RateTracker();

// --- Announcements: results of actions, read out by screen readers (role=status). ---

let announcedAt = 0;
function announce(message, kind = 'ok') {
  announceEl.className = `announce ${kind}`;
  announceEl.textContent = message;
  announcedAt = Date.now();
}

// --- Routing: #/, #/queues/<name>?state=...&dedupKey=..., #/jobs/<id>, #/failed, #/workers?queue=...,
// #/schedules, #/cluster ---

// Any hash the router does not know.
const notFound = {
  render(root, ctx) {
    ctx.setTitle('Not found');
    root.append(
      h('h1', { tabindex: '-1' }, 'Page not found'),
      h('p', {}, 'There is no such page in the dashboard. ', h('a', { href: '#/' }, 'Go to the queues.')),
    );
  },
};

function route() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, search = ''] = hash.split('?');
  const params = new URLSearchParams(search);
  let parts;
  try {
    parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  } catch {
    return { module: notFound, nav: null, params }; // a malformed %-escape
  }
  if (parts.length === 0) return { module: overview, nav: 'overview', params };
  if (parts[0] === 'queues' && parts.length === 2) return { module: queue, nav: 'overview', name: parts[1], params };
  if (parts[0] === 'jobs' && parts.length === 2) return { module: job, nav: null, id: parts[1], params };
  if (parts[0] === 'failed' && parts.length === 1) return { module: failed, nav: 'failed', params };
  if (parts[0] === 'cluster' && parts.length === 1) return { module: cluster, nav: 'cluster', params };
  if (parts[0] === 'workers' && parts.length === 1) return { module: workers, nav: 'workers', params };
  if (parts[0] === 'schedules' && parts.length === 1) return { module: schedules, nav: 'schedules', params };
  return { module: notFound, nav: null, params };
}

function navigate(hash) {
  if (location.hash === hash) showRoute(false);
  else location.hash = hash;
}

let current = null; // the shown view: {onQueues?(queues), dispose?()}
let lastQueues = null;

function showRoute(moveFocus) {
  current?.dispose?.();
  // An announcement made just before the navigation (e.g. "job deleted") stays; older ones go.
  if (Date.now() - announcedAt > 1500) announce('');
  const r = route();
  for (const link of document.querySelectorAll('[data-nav]')) {
    if (link.dataset.nav === r.nav) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  view.replaceChildren();
  current = r.module.render(view, ctx, r) ?? {};
  if (lastQueues) current.onQueues?.(lastQueues);
  // After a click on a link, take keyboard and screen-reader focus to the new page's heading.
  if (moveFocus) view.querySelector('h1')?.focus();
}

// What every view gets.
const ctx = {
  api,
  rates,
  announce,
  navigate,
  // Title of the browser tab.
  setTitle(text) {
    document.title = text ? `${text} · jobbroker` : 'jobbroker';
  },
  // Polls at once (after an action changed a queue) rather than waiting for the next tick.
  refreshQueues: () => poll(),
};

// --- Polling of GET /queues: every 2 s while the tab is visible. ---

let timer = null;
let polling = false;
const live = document.getElementById('live');

async function poll() {
  if (polling) return;
  polling = true;
  clearTimeout(timer);
  try {
    const { queues = [] } = await api.listQueues();
    lastQueues = queues;
    rates.add(queues, Date.now());
    live.textContent = 'Live';
    live.classList.remove('offline', 'starting');
    current?.onQueues?.(queues);
  } catch (err) {
    live.textContent = err.status === 401 ? 'Signed out' : err.starting ? 'Starting' : 'Offline';
    live.classList.toggle('starting', Boolean(err.starting));
    live.classList.toggle('offline', !err.starting);
    current?.onPollError?.(err);
  } finally {
    polling = false;
    updateAuthButtons();
    if (!document.hidden) timer = setTimeout(poll, POLL_MS);
  }
}

document.addEventListener('visibilitychange', () => {
  clearTimeout(timer);
  if (document.hidden) {
    live.textContent = 'Paused';
    return;
  }
  // The rates of a poll after a pause would average over the whole pause.
  rates.gap();
  poll();
});

// --- Sign-in: on a 401 the API module asks here for a token. ---

let declined = false;
const signIn = document.getElementById('sign-in');
const signOut = document.getElementById('sign-out');

function updateAuthButtons() {
  signOut.hidden = !api.token();
  signIn.hidden = !declined;
}

api.onUnauthorized(async (refused) => {
  // Once the user said no, the poll does not open the dialog again every 2 s; the Sign in
  // button in the header brings it back.
  if (declined) return null;
  const token = await askToken(refused);
  if (!token) declined = true;
  updateAuthButtons();
  return token;
});

signIn.addEventListener('click', () => {
  declined = false;
  updateAuthButtons();
  showRoute(false);
  poll();
});

signOut.addEventListener('click', () => {
  api.setToken('');
  declined = true;
  lastQueues = null;
  updateAuthButtons();
  announce('Signed out.');
  showRoute(false);
});

window.addEventListener('hashchange', () => showRoute(true));
showRoute(false);
poll();
