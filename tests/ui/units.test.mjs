// The dashboard's pure modules (ui/format.js, ui/rates.js) run in Node as they are: no browser,
// no broker.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  STATES,
  formatDuration,
  formatRate,
  hexDump,
  looksLikeJobId,
  parseDuration,
  renderBytes,
  stateLabel,
} from '../../ui/format.js';
import { RateTracker } from '../../ui/rates.js';

const b64 = (bytes) => Buffer.from(bytes).toString('base64');

test('bytes: JSON pretty-printed, other UTF-8 as text, the rest as hex', () => {
  assert.deepEqual(renderBytes(b64('{"a":[1,2]}')), { kind: 'json', text: '{\n  "a": [\n    1,\n    2\n  ]\n}', size: 11, truncated: false });
  assert.equal(renderBytes(b64('héllo')).kind, 'text');
  assert.equal(renderBytes(b64('héllo')).text, 'héllo');
  assert.equal(renderBytes('').kind, 'empty');
  const bin = renderBytes(b64([0xc3, 0x28, 0x41]));
  assert.equal(bin.kind, 'binary', 'an invalid UTF-8 sequence');
  assert.equal(bin.text, `00000000  c3 28 41${' '.repeat(3 * 13 + 1)}  |.(A|`);
  // URL-safe base64 is accepted too.
  assert.equal(renderBytes(b64([0xfb, 0xff]).replace('+', '-').replace('/', '_')).size, 2);
});

test('hex dump: 16 bytes a line in two groups, offsets in hex', () => {
  const lines = hexDump(Uint8Array.from({ length: 20 }, (_, i) => i + 60)).split('\n');
  assert.equal(lines.length, 2);
  assert.equal(lines[0], '00000000  3c 3d 3e 3f 40 41 42 43  44 45 46 47 48 49 4a 4b  |<=>?@ABCDEFGHIJK|');
  assert.match(lines[1], /^00000010 {2}4c 4d 4e 4f {2}/);
});

test('durations and rates read as people write them', () => {
  assert.equal(parseDuration('1.500s'), 1.5);
  assert.equal(parseDuration('0s'), 0);
  assert.equal(parseDuration(undefined), 0);
  assert.equal(formatDuration(0.25), '250 ms');
  assert.equal(formatDuration(42), '42 s');
  assert.equal(formatDuration(125), '2 min 5 s');
  assert.equal(formatDuration(7200), '2 h');
  assert.equal(formatDuration(90061), '1 d 1 h');
  assert.equal(formatRate(0), '0/s');
  assert.equal(formatRate(2.46), '2.5/s');
  assert.equal(formatRate(1234.4), '1,234/s');
  assert.equal(formatRate(null), '—');
});

test('the states, in the order a job moves through them, Waiting first', () => {
  assert.deepEqual(
    STATES.map((s) => s.label),
    ['Waiting', 'Ready', 'Scheduled', 'Active', 'Completed', 'Failed', 'Cancelled'],
  );
  assert.equal(stateLabel('JOB_STATE_WAITING'), 'Waiting');
  assert.equal(stateLabel('JOB_STATE_SOMETHING_NEW'), 'Something new', 'a state this dashboard does not know');
});

test('job ids are told from dedup keys', () => {
  assert.equal(looksLikeJobId('01ARZ3NDEKTSV4RRFFQ69G5FAV'), true);
  assert.equal(looksLikeJobId('01arz3ndektsv4rrffq69g5fav'), true);
  assert.equal(looksLikeJobId('order-30'), false);
  assert.equal(looksLikeJobId('01ARZ3NDEKTSV4RRFFQ69G5FAU'), false, 'U is not Crockford base32');
});

test('rates come from counter deltas; a counter going down is a restart and is skipped', () => {
  const q = (enq, done) => ({ name: 'q', enqueuedTotal: String(enq), completedTotal: String(done) });
  const r = new RateTracker(60_000);
  r.add([q(100, 50)], 0);
  assert.equal(r.latest('q'), null, 'one poll gives no rate');
  r.add([q(110, 50)], 500); // too soon after the previous poll: not used
  r.add([q(120, 60)], 2000);
  assert.deepEqual(r.latest('q'), { t: 2000, enqueue: 10, complete: 5 });
  r.add([q(3, 1)], 4000); // the broker restarted
  assert.equal(r.series('q').length, 1);
  r.add([q(13, 3)], 6000);
  assert.deepEqual(r.latest('q'), { t: 6000, enqueue: 5, complete: 1 });
  assert.equal(r.total.length, 2);
  // After a gap (hidden tab) the next poll starts afresh rather than averaging over the gap.
  r.gap();
  r.add([q(1000, 1000)], 600_000);
  assert.equal(r.series('q').length, 2);
  // Points older than the window are dropped.
  r.add([q(1010, 1000)], 602_000);
  assert.deepEqual(r.series('q').map((p) => p.t), [602_000]);
  // A broker without the counters.
  const old = new RateTracker();
  old.add([{ name: 'q' }], 0);
  assert.equal(old.supported, false);
});
