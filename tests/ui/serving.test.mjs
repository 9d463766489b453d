// The broker serves every file of ui/ as it is on disk (so a rebuild embedded the current
// dashboard), with its content type, and the API's guards the dashboard relies on.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { repoRoot, startBroker } from './broker.mjs';

const uiDir = path.join(repoRoot, 'ui');
const TYPES = { '.html': 'text/html', '.js': 'javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };

let broker;
before(async () => {
  broker = await startBroker();
});
after(async () => {
  await broker?.stop();
});

test('every ui/ file is served byte for byte with its content type', async () => {
  const names = readdirSync(uiDir).filter((n) => !n.startsWith('.'));
  assert.ok(names.includes('index.html') && names.includes('app.js'));
  const stale = [];
  for (const name of names) {
    const response = await fetch(`${broker.url}/${name}`);
    if (response.status === 404) {
      stale.push(`${name} (not embedded)`);
      continue;
    }
    assert.equal(response.status, 200, `GET /${name}`);
    const type = TYPES[path.extname(name)];
    if (type) assert.ok(response.headers.get('content-type').includes(type), `${name}: ${response.headers.get('content-type')}`);
    const served = Buffer.from(await response.arrayBuffer());
    if (!served.equals(readFileSync(path.join(uiDir, name)))) stale.push(name);
  }
  assert.deepEqual(stale, [], 'the binary serves older copies of these ui/ files: rebuild the broker');
  const index = await fetch(`${broker.url}/`);
  assert.equal(await index.text(), readFileSync(path.join(uiDir, 'index.html'), 'utf8'));
});

test('a POST without a JSON body is refused, so a cross-site form cannot act', async () => {
  const form = await fetch(`${broker.url}/api/v1/queues/q/pause`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: 'a=b',
  });
  assert.equal(form.status, 415);
  const missing = await fetch(`${broker.url}/api/v1/queues/nope`);
  assert.equal(missing.status, 404);
  const body = await missing.json();
  assert.equal(body.code, 'NOT_FOUND');
  assert.match(body.message, /nope/);
});
