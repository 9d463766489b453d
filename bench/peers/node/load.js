#!/usr/bin/env node
'use strict';
// Runs one benchmark workload against one peer system and prints one JSON line:
//   node load.js --system bullmq|beanstalkd --mode enqueue|batch|e2e|drain|latency --port P [flags]
// The workloads mirror jobbroker-bench's (see bench/peers/README.md); `node load.js --help`
// lists the flags. Exit status: 0 when every job went through, 1 on errors or timeout, 2 on bad
// usage.

const { NowMs, ParseFlags, PrintReport, kUsage } = require('./common');

const kDrivers = {
  bullmq: () => require('./bullmq_load'),
  beanstalkd: () => require('./beanstalkd_load'),
};

async function Main() {
  let flags;
  try {
    flags = ParseFlags(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${err.message}\n${kUsage}\n`);
    process.exit(2);
  }
  const driver = kDrivers[flags.system]();
  if (!driver[flags.mode]) {
    // A workload the system has no counterpart for (beanstalkd has no batch put): say so in the
    // same JSON form, with null figures, so the report shows "n/a" rather than a gap.
    process.stdout.write(
      `${JSON.stringify({
        mode: flags.mode,
        workload: flags.mode,
        system: flags.system,
        config: flags.config || flags.system,
        jobs: flags.jobs,
        done: 0,
        jobs_per_sec: null,
        unsupported: true,
      })}\n`,
    );
    process.stderr.write(`${flags.system} has no ${flags.mode} workload; reported as null\n`);
    return 0;
  }
  // The run owns a report object it keeps current; when time runs out the watchdog prints what
  // was done so far and exits, whatever the run is waiting for.
  const run = { report: null };
  const watchdog = setTimeout(() => {
    if (run.report) {
      run.report.timedOut = true;
      run.report.seconds = (NowMs() - run.report.startMs) / 1000;
      PrintReport(flags, run.report);
    }
    process.stderr.write(`load.js: gave up after --timeout ${flags.timeout} s\n`);
    process.exit(1);
  }, flags.timeout * 1000);
  watchdog.unref();
  const r = await driver[flags.mode](flags, run);
  PrintReport(flags, r);
  return r.done >= flags.jobs && r.errors.count === 0 ? 0 : 1;
}

Main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`load.js: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
