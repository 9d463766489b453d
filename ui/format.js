// Turns the API's proto3 JSON values into text for people. Pure functions: no DOM, no fetch.

// The job states in the order a job usually moves through them, with the words the dashboard
// uses for them. WAITING is a job whose dependencies (depends_on) have not all completed yet.
// FAILED is a dead job: it ran out of attempts or failed permanently.
export const STATES = [
  { name: 'JOB_STATE_WAITING', label: 'Waiting' },
  { name: 'JOB_STATE_READY', label: 'Ready' },
  { name: 'JOB_STATE_SCHEDULED', label: 'Scheduled' },
  { name: 'JOB_STATE_ACTIVE', label: 'Active' },
  { name: 'JOB_STATE_COMPLETED', label: 'Completed' },
  { name: 'JOB_STATE_FAILED', label: 'Failed' },
  { name: 'JOB_STATE_CANCELLED', label: 'Cancelled' },
];

export const TERMINAL_STATES = ['JOB_STATE_COMPLETED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED'];

export function stateLabel(name) {
  return STATES.find((s) => s.name === name)?.label ?? humanEnum(name, 'JOB_STATE_');
}

// "FAIL_REASON_ATTEMPTS_EXHAUSTED" -> "Attempts exhausted".
export function humanEnum(name, prefix) {
  if (!name) return '';
  const words = name.startsWith(prefix) ? name.slice(prefix.length) : name;
  const s = words.toLowerCase().replaceAll('_', ' ');
  return s.charAt(0).toUpperCase() + s.slice(1);
}

// int64 values arrive as strings ("3"); absent means the default, 0. Counts stay far below
// 2^53, so a Number holds them exactly.
export function num(value) {
  const n = Number(value ?? 0);
  return Number.isFinite(n) ? n : 0;
}

const countFormat = new Intl.NumberFormat('en-US');
export function formatCount(value) {
  return countFormat.format(num(value));
}

// Jobs per second: one decimal below 10 so a trickle is still visible, none above.
export function formatRate(perSecond) {
  if (perSecond === null || perSecond === undefined) return '—';
  if (perSecond === 0) return '0/s';
  if (perSecond < 10) return `${perSecond.toFixed(1)}/s`;
  return `${countFormat.format(Math.round(perSecond))}/s`;
}

// A proto3 JSON Duration ("1.500s", "-3s") -> seconds; 0 when absent or malformed.
export function parseDuration(text) {
  if (typeof text !== 'string' || !text.endsWith('s')) return 0;
  const n = Number(text.slice(0, -1));
  return Number.isFinite(n) ? n : 0;
}

// Seconds -> "850 ms", "12 s", "3 min 5 s", "2 h 3 min", "4 d 2 h": the two largest units.
export function formatDuration(seconds) {
  if (!Number.isFinite(seconds)) return '—';
  const sign = seconds < 0 ? '−' : '';
  let s = Math.abs(seconds);
  if (s < 1) return `${sign}${Math.round(s * 1000)} ms`;
  if (s < 60) return `${sign}${s < 10 ? s.toFixed(1).replace(/\.0$/, '') : Math.round(s)} s`;
  s = Math.round(s);
  const units = [
    ['d', 86400],
    ['h', 3600],
    ['min', 60],
    ['s', 1],
  ];
  const parts = [];
  for (const [unit, size] of units) {
    if (s >= size || parts.length > 0) {
      parts.push([Math.floor(s / size), unit]);
      s %= size;
    }
    if (parts.length === 2) break;
  }
  const shown = parts.filter(([n], i) => i === 0 || n > 0);
  return sign + shown.map(([n, unit]) => `${n} ${unit}`).join(' ');
}

// RFC 3339 -> Date, or null when absent (an unset Timestamp is left out of the JSON).
export function parseTime(text) {
  if (!text) return null;
  const d = new Date(text);
  return Number.isNaN(d.getTime()) ? null : d;
}

const pad = (n, width = 2) => String(n).padStart(width, '0');

// Local wall-clock time, to the second, in a fixed sortable shape: "2026-12-01 09:40:05".
export function formatTime(date) {
  if (!date) return '—';
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`
  );
}

// "3 min ago" / "in 12 s", relative to `now` (a Date).
export function formatAgo(date, now = new Date()) {
  if (!date) return '';
  const seconds = (now.getTime() - date.getTime()) / 1000;
  if (Math.abs(seconds) < 1) return 'just now';
  return seconds > 0 ? `${formatDuration(seconds)} ago` : `in ${formatDuration(-seconds)}`;
}

// Bytes as base64 (proto3 JSON; standard or URL-safe alphabet) -> Uint8Array.
export function decodeBase64(text) {
  const b64 = (text ?? '').replaceAll('-', '+').replaceAll('_', '/');
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

const MAX_SHOWN_BYTES = 64 * 1024;

// How to show a bytes field (payload, result, checkpoint): valid UTF-8 is shown as text,
// pretty-printed when it is JSON; anything else as a hex dump. Large values are cut at 64 KiB.
// Returns {kind: 'empty' | 'json' | 'text' | 'binary', text, size, truncated}.
export function renderBytes(base64) {
  let bytes;
  try {
    bytes = decodeBase64(base64);
  } catch {
    return { kind: 'text', text: String(base64), size: String(base64).length, truncated: false };
  }
  const size = bytes.length;
  if (size === 0) return { kind: 'empty', text: '', size, truncated: false };
  let text = null;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    // Not UTF-8: fall through to the hex dump.
  }
  if (text !== null) {
    try {
      const pretty = JSON.stringify(JSON.parse(text), null, 2);
      return cut('json', pretty, size);
    } catch {
      return cut('text', text, size);
    }
  }
  const shown = bytes.subarray(0, MAX_SHOWN_BYTES);
  return { kind: 'binary', text: hexDump(shown), size, truncated: shown.length < size };
}

function cut(kind, text, size) {
  const truncated = text.length > MAX_SHOWN_BYTES;
  return { kind, text: truncated ? text.slice(0, MAX_SHOWN_BYTES) : text, size, truncated };
}

// The classic layout: offset, 16 bytes in hex (two groups of 8), then the printable ASCII.
export function hexDump(bytes) {
  const lines = [];
  for (let off = 0; off < bytes.length; off += 16) {
    const row = bytes.subarray(off, off + 16);
    const hex = [];
    let ascii = '';
    for (let i = 0; i < 16; i++) {
      if (i === 8) hex.push('');
      if (i < row.length) {
        hex.push(row[i].toString(16).padStart(2, '0'));
        ascii += row[i] >= 0x20 && row[i] < 0x7f ? String.fromCharCode(row[i]) : '.';
      } else {
        hex.push('  ');
      }
    }
    lines.push(`${off.toString(16).padStart(8, '0')}  ${hex.join(' ')}  |${ascii}|`);
  }
  return lines.join('\n');
}

export function formatBytes(size) {
  if (size < 1024) return `${size} B`;
  if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} KiB`;
  return `${(size / 1024 / 1024).toFixed(1)} MiB`;
}

// Job ids are ULIDs: 26 characters of Crockford base32. Used to tell a job id from a dedup key
// in the search box.
export function looksLikeJobId(text) {
  return /^[0-9A-HJKMNP-TV-Z]{26}$/i.test(text);
}
