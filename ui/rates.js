// Live enqueue and complete rates, derived from the counters every QueueInfo carries
// (enqueuedTotal, completedTotal: jobs since the broker started) by differencing two polls.

const MIN_INTERVAL_MS = 1000;

export class RateTracker {
  // Points older than `windowMs` are dropped.
  constructor(windowMs = 5 * 60 * 1000) {
    this.windowMs = windowMs;
    this.last = new Map(); // queue -> {t, enqueued, completed} of the previous poll
    this.perQueue = new Map(); // queue -> [{t, enqueue, complete}] in jobs/s
    this.total = []; // the same summed over the queues
    this.supported = true; // false when the broker reports no counters
  }

  // Adds one poll of GET /queues taken at `t` (ms).
  add(queues, t) {
    let enqueue = 0;
    let complete = 0;
    let any = false;
    this.supported = queues.length === 0 || queues.some((q) => q.enqueuedTotal !== undefined);
    for (const q of queues) {
      if (q.enqueuedTotal === undefined || q.completedTotal === undefined) continue;
      const now = { t, enqueued: Number(q.enqueuedTotal), completed: Number(q.completedTotal) };
      const before = this.last.get(q.name);
      // An extra poll right after an action would give a rate over a fraction of a second, all
      // noise: keep differencing from the older poll instead.
      if (before && t - before.t < MIN_INTERVAL_MS) continue;
      this.last.set(q.name, now);
      // Nothing to difference on the first poll; a counter that went down means the broker
      // restarted, and that delta would be meaningless.
      if (!before || now.enqueued < before.enqueued || now.completed < before.completed) continue;
      const dt = (t - before.t) / 1000;
      if (dt <= 0) continue;
      const point = {
        t,
        enqueue: (now.enqueued - before.enqueued) / dt,
        complete: (now.completed - before.completed) / dt,
      };
      this.#push(this.#series(q.name), point);
      enqueue += point.enqueue;
      complete += point.complete;
      any = true;
    }
    if (any) this.#push(this.total, { t, enqueue, complete });
    // Forget the queues that are gone (purged away or the broker restarted empty).
    const names = new Set(queues.map((q) => q.name));
    for (const name of this.last.keys()) {
      if (!names.has(name)) {
        this.last.delete(name);
        this.perQueue.delete(name);
      }
    }
  }

  // Forgets the previous poll, so that the next one starts afresh instead of averaging over a
  // pause (a hidden tab polls nothing).
  gap() {
    this.last.clear();
  }

  series(queue) {
    return this.perQueue.get(queue) ?? [];
  }

  // The latest rates of a queue, or null before the second poll.
  latest(queue) {
    const s = this.series(queue);
    return s.length ? s[s.length - 1] : null;
  }

  #series(queue) {
    let s = this.perQueue.get(queue);
    if (!s) this.perQueue.set(queue, (s = []));
    return s;
  }

  #push(series, point) {
    series.push(point);
    while (series.length && series[0].t < point.t - this.windowMs) series.shift();
  }
}
