// The broker's HTTP JSON API (/api/v1/): one function per call, bearer-token handling, and
// errors as ApiError carrying the broker's message for the user.

const BASE = '/api/v1';
const TOKEN_KEY = 'jobbroker.token';

// A failed call. `status` is the HTTP status (0 when the broker could not be reached), `code`
// the broker's code name ("NOT_FOUND"), `message` the text to show.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }

  // The broker is up but still starting (reading its jobs back, waiting for etcd): its HTTP
  // server answers before the API does, with 503 and a message that says how far it got
  // (server/http/http_server.cc).
  get starting() {
    return this.status === 503 && this.code === 'UNAVAILABLE' && this.message.startsWith('the broker is starting');
  }
}

// The token lives in sessionStorage: it survives a reload of this tab but not the tab itself,
// and other sites cannot read it.
export function token() {
  return sessionStorage.getItem(TOKEN_KEY) ?? '';
}
export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Called on a 401 with whether a token was sent (so the prompt can say it was refused);
// resolves with a new token, or null when the user declined. Installed by app.js.
let askForToken = async () => null;
export function onUnauthorized(fn) {
  askForToken = fn;
}

// Concurrent calls that all get a 401 share one prompt.
let pendingPrompt = null;
function promptOnce(refused) {
  pendingPrompt ??= askForToken(refused).finally(() => {
    pendingPrompt = null;
  });
  return pendingPrompt;
}

// Sends one request; on a 401 asks for a token and sends it again with it, until the broker
// accepts a token or the user declines (then the 401 is thrown).
async function call(method, path, body) {
  for (;;) {
    const sent = token();
    const response = await send(method, path, body, sent);
    if (response.status === 401) {
      // Another call may have already got a new token while this one was in flight.
      if (token() !== sent) continue;
      const fresh = await promptOnce(sent !== '');
      if (fresh) {
        setToken(fresh);
        continue;
      }
    }
    return parse(response);
  }
}

async function send(method, path, body, bearer) {
  const headers = { Accept: 'application/json' };
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const init = { method, headers, cache: 'no-store' };
  if (method !== 'GET') {
    // The broker refuses a POST or DELETE without a JSON body (415): a cross-site form cannot
    // send one.
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body ?? {});
  }
  try {
    return await fetch(BASE + path, init);
  } catch (err) {
    throw new ApiError(0, 'UNAVAILABLE', `Cannot reach the broker (${err.message}).`);
  }
}

async function parse(response) {
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : {};
  } catch {
    // Not JSON: a proxy's error page, or a broker without the API. Handled below.
  }
  if (response.ok && json !== null) return json;
  if (response.ok) {
    throw new ApiError(response.status, 'BAD_RESPONSE', 'The broker answered with something that is not JSON.');
  }
  const code = json?.code ?? `HTTP_${response.status}`;
  const message =
    json?.message ||
    (response.status === 401 ? 'An access token is required.' : `${response.status} ${response.statusText}`.trim());
  throw new ApiError(response.status, code, message);
}

const seg = encodeURIComponent;

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '' && v !== false) q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

export const listQueues = () => call('GET', '/queues');
export const getQueue = (queue) => call('GET', `/queues/${seg(queue)}`);

// {state, pageSize, pageToken, newestFirst, dedupKey}; an empty state lists every state.
export const listJobs = (queue, params) => call('GET', `/queues/${seg(queue)}/jobs${query(params)}`);

export const pauseQueue = (queue) => call('POST', `/queues/${seg(queue)}/pause`, {});
export const resumeQueue = (queue) => call('POST', `/queues/${seg(queue)}/resume`, {});

// An empty `states` purges every terminal state.
export const purgeQueue = (queue, states) => call('POST', `/queues/${seg(queue)}/purge`, { states });

// Bulk redrive of the queue's dead (or cancelled) jobs.
export const retryQueue = (queue, { state = 'JOB_STATE_FAILED', dryRun = false, limit = 1000 } = {}) =>
  call('POST', `/queues/${seg(queue)}/retry`, { state, dryRun, limit });

// Nodes and partitions: who leads what, in which epoch, with which replicas in sync.
export const getCluster = () => call('GET', '/cluster');
export const listWorkers = (queue) => call('GET', queue ? `/queues/${seg(queue)}/workers` : '/workers');

// Recurring schedules. A put sends the whole Schedule (proto3 JSON); the path names it.
export const listSchedules = () => call('GET', '/schedules');
export const getSchedule = (id) => call('GET', `/schedules/${seg(id)}`);
export const putSchedule = (id, schedule) => call('POST', `/schedules/${seg(id)}`, schedule);
export const deleteSchedule = (id) => call('DELETE', `/schedules/${seg(id)}`, {});
export const triggerSchedule = (id) => call('POST', `/schedules/${seg(id)}/trigger`, {});

export const getJob = (id) => call('GET', `/jobs/${seg(id)}`);
export const cancelJob = (id) => call('POST', `/jobs/${seg(id)}/cancel`, {});
export const retryJob = (id) => call('POST', `/jobs/${seg(id)}/retry`, {});
export const deleteJob = (id) => call('DELETE', `/jobs/${seg(id)}`, {});
