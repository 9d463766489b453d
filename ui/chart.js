// Line charts of the enqueue and complete rates as SVG, drawn at the pixel size of their box
// (so text keeps its size on a phone). Colours come from style.css, which also dashes the
// complete line so the two differ without colour.

import { svg } from './dom.js';
import { formatRate } from './format.js';

const MIN_WINDOW_MS = 30 * 1000;
const MAX_WINDOW_MS = 5 * 60 * 1000;

// The time span to show: the data so far, at least 30 s and at most 5 min, so a fresh page
// does not squeeze its first points into the right edge.
export function chartWindow(points, now) {
  if (points.length === 0) return MIN_WINDOW_MS;
  return Math.min(MAX_WINDOW_MS, Math.max(MIN_WINDOW_MS, now - points[0].t));
}

// A y-axis top at 1, 2 or 5 times a power of ten above `value`.
function niceMax(value) {
  if (value <= 1) return 1;
  const pow = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (m * pow >= value) return m * pow;
  return 10 * pow;
}

// `points`: [{t, enqueue, complete}], t in ms. Options: width and height in px, now and
// windowMs (the x axis), gapMs (points further apart are not joined: the tab was hidden),
// compact (a sparkline: no axes or labels), label (the accessible name).
export function rateChart(points, { width, height, now, windowMs, gapMs = 6000, compact = false, label }) {
  const pad = compact ? { left: 1, right: 1, top: 2, bottom: 2 } : { left: 44, right: 8, top: 10, bottom: 20 };
  const w = Math.max(10, width - pad.left - pad.right);
  const hgt = Math.max(10, height - pad.top - pad.bottom);
  const shown = points.filter((p) => p.t >= now - windowMs);
  const top = niceMax(Math.max(0, ...shown.map((p) => Math.max(p.enqueue, p.complete))));
  const x = (t) => pad.left + w * (1 - (now - t) / windowMs);
  const y = (v) => pad.top + hgt * (1 - v / top);

  const root = svg('svg', {
    class: compact ? 'chart chart-compact' : 'chart',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: label ? 'img' : null,
    'aria-label': label ?? null,
    'aria-hidden': label ? null : 'true',
    focusable: 'false',
  });

  if (!compact) {
    for (const v of [0, top / 2, top]) {
      root.append(
        svg('line', { class: 'grid', x1: pad.left, x2: pad.left + w, y1: y(v), y2: y(v) }),
        svg('text', { class: 'axis', x: pad.left - 6, y: y(v) + 4, 'text-anchor': 'end' }, formatRate(v)),
      );
    }
    const span = Math.round(windowMs / 1000);
    const spanText = span >= 60 && span % 60 === 0 ? `${span / 60} min ago` : `${span} s ago`;
    root.append(
      svg('text', { class: 'axis', x: pad.left, y: height - 4, 'text-anchor': 'start' }, spanText),
      svg('text', { class: 'axis', x: pad.left + w, y: height - 4, 'text-anchor': 'end' }, 'now'),
    );
  } else {
    root.append(svg('line', { class: 'grid', x1: pad.left, x2: pad.left + w, y1: y(0), y2: y(0) }));
  }

  for (const key of ['enqueue', 'complete']) {
    const d = path(shown, (p) => x(p.t), (p) => y(p[key]), gapMs);
    if (d) root.append(svg('path', { class: `line line-${key}`, d }));
  }
  return root;
}

// An SVG path through the points, lifting the pen across gaps. A lone point becomes a short
// dash so it is visible.
function path(points, fx, fy, gapMs) {
  const parts = [];
  let prev = null;
  for (const p of points) {
    const cmd = prev && p.t - prev.t <= gapMs ? 'L' : 'M';
    parts.push(`${cmd}${fx(p).toFixed(1)},${fy(p).toFixed(1)}`);
    prev = p;
  }
  if (parts.length === 1) parts.push(`h2`);
  return parts.join(' ');
}
