#!/usr/bin/env node
'use strict';
// Helpers for bench/peers/run.sh, which keeps its own logic in shell:
//
//   node report.js tag KEY=VALUE...   reads one JSON line on stdin, sets the keys (numbers stay
//                                     numbers), writes it to stdout
//   node report.js table FILE.jsonl   prints the comparison table and the ratios to jobbroker
//   node report.js free-port          prints a TCP port free on 127.0.0.1 right now
//
// The table takes, per system and workload, the median of the repeats; for e2e, the median per
// consumer setting and then the best setting.

const fs = require('node:fs');
const net = require('node:net');

function Tag(pairs) {
  const input = fs.readFileSync(0, 'utf8').trim();
  const line = JSON.parse(input);
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq < 0) throw new Error(`tag: expected KEY=VALUE, got ${pair}`);
    const key = pair.slice(0, eq);
    const value = pair.slice(eq + 1);
    line[key] = value !== '' && Number.isFinite(Number(value)) ? Number(value) : value;
  }
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

function FreePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${server.address().port}\n`);
    server.close();
  });
}

function Median(xs) {
  const s = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return null;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

// The consumer setting an e2e line ran with: C for the peers, workers x in-flight for jobbroker.
function E2eSetting(l) {
  return l.system === 'jobbroker' ? `W${l.workers}xK${l.in_flight}` : `C${l.concurrency}`;
}

// A run counts when it did every job without errors; a failed run's figure would mislead.
function Usable(l) {
  return !l.unsupported && !l.timed_out && l.errors === 0 && l.done >= l.jobs;
}

function Summarize(lines) {
  const order = [];
  const cells = new Map(); // config -> {system, durability, lines by workload}
  for (const l of lines) {
    if (l.kind === 'meta' || !l.config) continue;
    if (!cells.has(l.config)) {
      order.push(l.config);
      cells.set(l.config, { system: l.system, durability: l.durability, by: new Map() });
    }
    const c = cells.get(l.config);
    if (!c.by.has(l.workload)) c.by.set(l.workload, []);
    c.by.get(l.workload).push(l);
  }
  const rows = [];
  for (const config of order) {
    const c = cells.get(config);
    const row = { config, system: c.system, durability: c.durability, notes: [] };
    const pick = (workload, key) => {
      const ls = c.by.get(workload) || [];
      if (ls.length === 0) return undefined; // not run
      if (ls.every((l) => l.unsupported)) return null; // no such workload
      const ok = ls.filter(Usable);
      if (ok.length < ls.length) row.notes.push(`${workload}: ${ls.length - ok.length} failed run(s)`);
      return Median(ok.map((l) => l[key]));
    };
    // Microseconds of CPU per job, of the server or (key 'load') of the load process: node's
    // own figure for the run (client_cpu_s) where there is one, since starting node and loading
    // BullMQ costs about 0.2 s of CPU that is no part of the workload; else the whole process
    // (load_cpu_s; jobbroker-bench starts in about 0.03 s of CPU).
    const perJob = (ls, key = 'server_cpu_s') => {
      const cpu = (l) => (key === 'load' ? (l.client_cpu_s ?? l.load_cpu_s) : l[key]);
      const xs = ls.filter((l) => Usable(l) && typeof cpu(l) === 'number');
      return Median(xs.map((l) => (cpu(l) / l.done) * 1e6));
    };
    row.enqueue = pick('enqueue', 'jobs_per_sec');
    row.batch = pick('batch', 'jobs_per_sec');
    row.p50 = pick('latency', 'p50_ms');
    row.p99 = pick('latency', 'p99_ms');
    const lat = (c.by.get('latency') || []).filter(Usable);
    if (lat.length) {
      const achieved = Median(lat.map((l) => l.jobs_per_sec));
      const wanted = Median(lat.map((l) => l.rate || 1000));
      if (achieved && wanted && achieved < 0.9 * wanted) {
        row.notes.push(`latency: sent only ${Math.round(achieved)}/s of ${wanted}/s (each send waits for its reply)`);
      }
    }
    row.enqueueCpu = perJob(c.by.get('enqueue') || []);
    row.enqueueLoadCpu = perJob(c.by.get('enqueue') || [], 'load');
    // e2e and drain: the median per consumer setting, then the best setting.
    for (const workload of ['e2e', 'drain']) {
      const lines = c.by.get(workload) || [];
      if (!lines.length) continue;
      const settings = new Map();
      for (const l of lines) {
        const k = E2eSetting(l);
        if (!settings.has(k)) settings.set(k, []);
        settings.get(k).push(l);
      }
      const best = { rate: null, setting: '-', cpu: undefined, loadCpu: undefined, all: [] };
      for (const [k, ls] of settings) {
        const ok = ls.filter(Usable);
        if (ok.length < ls.length) row.notes.push(`${workload} ${k}: ${ls.length - ok.length} failed run(s)`);
        const rate = Median(ok.map((l) => l.jobs_per_sec));
        best.all.push(`${k}=${rate === null ? 'fail' : Math.round(rate)}`);
        if (rate !== null && (best.rate === null || rate > best.rate)) {
          Object.assign(best, { rate, setting: k, cpu: perJob(ls), loadCpu: perJob(ls, 'load') });
        }
      }
      row[workload] = best;
    }
    row.e2eAll = row.e2e ? row.e2e.all.join(' ') : '';
    row.e2eBest = row.e2e ? row.e2e.setting : undefined;
    row.e2eCpu = row.e2e ? row.e2e.cpu : undefined;
    row.e2eLoadCpu = row.e2e ? row.e2e.loadCpu : undefined;
    row.drainAll = row.drain ? row.drain.all.join(' ') : '';
    row.drain = row.drain ? row.drain.rate : undefined;
    row.e2e = row.e2e ? row.e2e.rate : undefined;
    // producer (jobbroker only): the median per client helper setting.
    row.producer = new Map();
    for (const l of c.by.get('producer') || []) {
      if (!row.producer.has(l.setting)) row.producer.set(l.setting, []);
      row.producer.get(l.setting).push(l);
    }
    for (const [k, ls] of row.producer) {
      const ok = ls.filter(Usable);
      if (ok.length < ls.length) row.notes.push(`producer ${k}: ${ls.length - ok.length} failed run(s)`);
      row.producer.set(k, { rate: Median(ok.map((l) => l.jobs_per_sec)), cpu: perJob(ls) });
    }
    // Jobs per throughput run (latency runs have their own fixed count).
    const jobs = new Set(
      [...c.by.entries()].filter(([w]) => w !== 'latency').flatMap(([, ls]) => ls.map((l) => l.jobs)),
    );
    row.jobs = [...jobs].sort((a, b) => a - b).join('/');
    rows.push(row);
  }
  return rows;
}

function Fmt(x, digits = 0) {
  if (x === undefined) return '-';
  if (x === null) return 'n/a';
  return digits ? x.toFixed(digits) : Math.round(x).toLocaleString('en-US');
}

function PrintTable(header, rows) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cols) =>
    cols.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join('  ');
  process.stdout.write(`${line(header)}\n`);
  process.stdout.write(`${widths.map((w) => '-'.repeat(w)).join('  ')}\n`);
  for (const r of rows) process.stdout.write(`${line(r)}\n`);
}

function Table(file) {
  const lines = fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((s) => s.startsWith('{'))
    .map((s) => JSON.parse(s));
  const rows = Summarize(lines);
  process.stdout.write('\nThroughput in jobs/s (median of repeats); latency from send to handler, ms\n\n');
  PrintTable(
    ['system', 'durability', 'jobs', 'enqueue/s', 'batch/s', 'e2e/s', 'e2e best', 'drain/s', 'lat p50', 'lat p99'],
    rows.map((r) => [
      r.config,
      r.durability || '',
      r.jobs,
      Fmt(r.enqueue),
      Fmt(r.batch),
      Fmt(r.e2e),
      r.e2eBest || '-',
      Fmt(r.drain),
      Fmt(r.p50, 2),
      Fmt(r.p99, 2),
    ]),
  );
  // One ratio table per jobbroker configuration (SYNC, and GROUP when it ran), against the peers.
  const peers = rows.filter((r) => r.system !== 'jobbroker');
  for (const jb of rows.filter((r) => r.system === 'jobbroker')) {
    // Throughput: jobbroker / peer; latency: peer / jobbroker. Either way above 1x means
    // jobbroker did better.
    const ratio = (mine, theirs, higherIsBetter) => {
      if (mine === undefined || theirs === undefined) return '-';
      if (mine === null || theirs === null || !mine || !theirs) return 'n/a';
      return `${(higherIsBetter ? mine / theirs : theirs / mine).toFixed(2)}x`;
    };
    if (peers.length) {
      process.stdout.write(
        `\n${jb.config} vs each peer (>1x: jobbroker better; throughput jobbroker/peer, latency peer/jobbroker)\n\n`,
      );
      PrintTable(
        ['peer', 'enqueue', 'batch', 'e2e', 'drain', 'lat p50', 'lat p99'],
        peers.map((r) => [
          r.config,
          ratio(jb.enqueue, r.enqueue, true),
          ratio(jb.batch, r.batch, true),
          ratio(jb.e2e, r.e2e, true),
          ratio(jb.drain, r.drain, true),
          ratio(jb.p50, r.p50, false),
          ratio(jb.p99, r.p99, false),
        ]),
      );
    }
    if (jb.producer.size && peers.length) {
      // Like for like: what a user's code calls, 64 concurrent single-job enqueues, next to the
      // peers' own 64 concurrent adds (their enqueue workload).
      process.stdout.write(
        `\n${jb.config}: producer helpers, 64 concurrent enqueue() of one job, jobs/s and ratio to each peer's enqueue\n\n`,
      );
      PrintTable(
        ['helper', 'jobs/s', 'srv us/job', ...peers.map((r) => r.config)],
        [...jb.producer].map(([k, v]) => [
          k,
          Fmt(v.rate),
          Fmt(v.cpu, 1),
          ...peers.map((r) => ratio(v.rate, r.enqueue, true)),
        ]),
      );
    }
  }
  process.stdout.write(
    '\nCPU per job, microseconds (user+sys / jobs done): the server, and the load process\n' +
      '(jobbroker-bench or node) on the same 2-core machine\n\n',
  );
  PrintTable(
    ['system', 'enqueue srv', 'enqueue load', 'e2e srv', 'e2e load'],
    rows.map((r) => [
      r.config,
      Fmt(r.enqueueCpu, 1),
      Fmt(r.enqueueLoadCpu, 1),
      Fmt(r.e2eCpu, 1),
      Fmt(r.e2eLoadCpu, 1),
    ]),
  );
  process.stdout.write('\ne2e and drain jobs/s per consumer setting (C: consumer concurrency; W x K: workers x in-flight)\n\n');
  for (const r of rows) process.stdout.write(`  ${r.config.padEnd(20)} e2e: ${r.e2eAll || '-'}\n`);
  for (const r of rows) process.stdout.write(`  ${r.config.padEnd(20)} drain: ${r.drainAll || '-'}\n`);
  const notes = [...new Set(rows.flatMap((r) => r.notes.map((n) => `  ${r.config}: ${n}`)))];
  if (notes.length) process.stdout.write(`\nnotes:\n${notes.join('\n')}\n`);
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'tag') Tag(args);
else if (cmd === 'table' && args.length === 1) Table(args[0]);
else if (cmd === 'free-port') FreePort();
else {
  process.stderr.write('usage: node report.js tag KEY=VALUE... | table FILE.jsonl | free-port\n');
  process.exit(2);
}
