// With --auth-tokens the dashboard asks for a bearer token, says when one is refused, keeps
// the accepted one for the tab's session, and shows the broker's message for a token without
// the admin role.

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, test } from 'node:test';
import { launch, openPage } from './browser.mjs';
import { startDashboard } from './dashboard.mjs';
import { connect, enqueue } from './grpc.mjs';

const ADMIN = 'jb-ui-admin-3f9c1e';
const PRODUCER = 'jb-ui-producer-71b2d0';
const sha256 = (token) => createHash('sha256').update(token).digest('hex');
// The same file format as docs/operations.md: the SHA-256 of each token, never the token.
const TOKENS = JSON.stringify({
  tokens: [
    { name: 'ops', roles: ['producer', 'worker', 'admin'], queues: ['*'], sha256: sha256(ADMIN) },
    { name: 'producer', roles: ['producer'], queues: ['*'], sha256: sha256(PRODUCER) },
  ],
});

let dash;
let client;
let browser;

before(async () => {
  dash = await startDashboard({
    files: { 'tokens.json': TOKENS },
    args: (dir) => ['--auth-tokens', `${dir}/tokens.json`],
  });
  client = connect(dash.grpc, ADMIN);
  browser = await launch();
  for (let i = 0; i < 2; i++) await enqueue(client, 'secure', '{}');
});

after(async () => {
  await browser?.close();
  client?.close();
  await dash?.stop();
});

// A 401 shows up as a failed resource load in the console: expected here, nothing else is.
const unexpected = (problems) => problems.filter((p) => !/status of 40[13]/.test(p));

test('the dashboard asks for a token, refuses a wrong one, and works with the right one', async () => {
  const response = await fetch(`${dash.url}/api/v1/queues`);
  assert.equal(response.status, 401, 'the API itself needs a token');

  const page = await openPage(browser, dash.url);
  const dialog = page.getByRole('dialog', { name: 'Access token' });
  await dialog.waitFor();
  await dialog.getByLabel('Token').fill('not-a-token');
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  // Asked again, saying why.
  await dialog.getByText('The broker did not accept that token.').waitFor();
  await dialog.getByLabel('Token').fill(ADMIN);
  await dialog.getByLabel('Token').press('Enter');
  await dialog.waitFor({ state: 'hidden' });
  await page.getByRole('link', { name: 'Ready jobs in secure: 2', exact: true }).waitFor();

  // The token lasts for the tab's session: a reload asks nothing.
  await page.reload();
  await page.getByRole('link', { name: 'Ready jobs in secure: 2', exact: true }).waitFor();
  assert.equal(await dialog.isVisible(), false);

  // An action goes through with it.
  await page.getByRole('button', { name: 'Pause queue secure' }).click();
  await page.getByRole('status').filter({ hasText: 'Queue secure paused.' }).waitFor();
  assert.equal((await client.admin.getQueue({ queue: 'secure' })).policy.paused, true);

  // Signing out forgets it; the next call asks again.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('button', { name: 'Sign in' }).click();
  await dialog.waitFor();
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  await dialog.waitFor({ state: 'hidden' });
  assert.deepEqual(unexpected(page.problems), []);
});

test('a token without the admin role gets the broker’s message, not another prompt', async () => {
  const page = await openPage(browser, dash.url);
  const dialog = page.getByRole('dialog', { name: 'Access token' });
  await dialog.getByLabel('Token').fill(PRODUCER);
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await dialog.waitFor({ state: 'hidden' });
  const alert = page.getByRole('alert');
  await alert.waitFor();
  assert.match(await alert.textContent(), /producer/);
  assert.equal(await dialog.isVisible(), false);
  assert.deepEqual(unexpected(page.problems), []);
});
